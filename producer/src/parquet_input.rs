//! Parquet input: records streamed from a Parquet file by row groups.
//!
//! Only the text column and the id column are read (a projection), one row
//! group at a time, in record batches of [`BATCH_ROWS`] rows: a 5 GB file
//! is never held in memory, whatever its other columns hold. The text
//! column may be any Arrow string type (`Utf8`, `LargeUtf8`, `Utf8View`,
//! dictionary-encoded or not); the id column a string or an integer column
//! (an integer id becomes its decimal string). Nested column paths are not
//! supported: both name top-level columns.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::DataType;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};

use crate::input::{ReadOptions, RecordHasher, RecordSource, text_record};
use crate::jsonl::{ReadError, Record};

/// Rows per record batch read: bounds the memory a row group's texts take.
pub const BATCH_ROWS: usize = 4096;

/// Records read from a Parquet file.
///
/// Its [`RecordSource::sha256_hex`] is not a hash of the file's bytes but
/// of the records taken (each id and text, by [`RecordHasher`]): the same
/// rows re-encoded (another compression, other row groups, other columns
/// beside them) give the same hash, and so count as the same input when a
/// job id is given again.
pub struct ParquetSource {
    path: PathBuf,
    file: File,
    meta: ArrowReaderMetadata,
    projection: ProjectionMask,
    text: Column,
    id: Option<Column>,
    generation: Option<crate::prompts::GenDefaults>,
    /// The next row group to open.
    next_group: usize,
    /// The row group being read.
    reader: Option<ParquetRecordBatchReader>,
    /// The rest of the batch being read: texts, and ids when read.
    texts: std::vec::IntoIter<Option<String>>,
    ids: Option<std::vec::IntoIter<Option<String>>>,
    /// Rows passed so far (taken or refused): the next row's 0-based number.
    row: u64,
    /// Records taken so far.
    taken: u64,
    /// Compressed bytes of the row groups read to their end.
    bytes: u64,
    hash: RecordHasher,
}

/// A column the records come from, and which flag named it.
#[derive(Debug, Clone)]
struct Column {
    name: String,
    flag: &'static str,
}

impl ParquetSource {
    /// Opens `path`, checking that it is a Parquet file with the text column
    /// (and the id column, when `opts` names one) of an accepted type.
    pub fn open(path: &Path, opts: &ReadOptions) -> Result<Self, ReadError> {
        let shown = path.display();
        let file = File::open(path)
            .map_err(|e| ReadError::Input(format!("cannot open input {shown}: {e}")))?;
        let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(|e| {
            ReadError::Input(format!("{shown} is not a readable Parquet file: {e}"))
        })?;
        let text = Column {
            name: opts.text_field.clone(),
            flag: "--text-field",
        };
        let id = opts.id_field.as_ref().map(|name| Column {
            name: name.clone(),
            flag: "--id-field",
        });
        let schema = meta.schema().clone();
        let mut roots = Vec::new();
        for (col, is_text) in std::iter::once((&text, true)).chain(id.iter().map(|c| (c, false))) {
            let Some((index, field)) = schema.column_with_name(&col.name) else {
                let columns: Vec<String> = schema
                    .fields()
                    .iter()
                    .map(|f| format!("{:?}", f.name()))
                    .collect();
                return Err(ReadError::Input(format!(
                    "{shown} has no column {:?} (named by {}); its columns are {}",
                    col.name,
                    col.flag,
                    if columns.is_empty() {
                        "none".to_owned()
                    } else {
                        columns.join(", ")
                    }
                )));
            };
            let accepted = if is_text {
                is_string(field.data_type())
            } else {
                is_string(field.data_type()) || is_integer(field.data_type())
            };
            if !accepted {
                return Err(ReadError::Input(format!(
                    "{shown}: column {:?} (named by {}) is of type {}; {}",
                    col.name,
                    col.flag,
                    field.data_type(),
                    if is_text {
                        "a text column must hold strings (Utf8, LargeUtf8 or Utf8View, \
                         dictionary-encoded or not)"
                    } else {
                        "an id column must hold strings (Utf8, LargeUtf8 or Utf8View, \
                         dictionary-encoded or not) or integers (Int8 to Int64, UInt8 to UInt64)"
                    }
                )));
            }
            roots.push(index);
        }
        let projection = ProjectionMask::roots(meta.parquet_schema(), roots);
        Ok(Self {
            path: path.to_path_buf(),
            file,
            meta,
            projection,
            text,
            id,
            generation: opts.generation.clone(),
            next_group: 0,
            reader: None,
            texts: Vec::new().into_iter(),
            ids: None,
            row: 0,
            taken: 0,
            bytes: 0,
            hash: RecordHasher::default(),
        })
    }

    /// The next batch with rows left, opening row groups as needed;
    /// `Ok(false)` at the end of the file.
    fn fill(&mut self) -> Result<bool, ReadError> {
        loop {
            if self.texts.len() > 0 {
                return Ok(true);
            }
            if let Some(reader) = &mut self.reader {
                match reader.next() {
                    Some(Ok(batch)) => {
                        self.take(&batch)?;
                        continue;
                    }
                    Some(Err(e)) => {
                        return Err(ReadError::Input(format!(
                            "{}: cannot read row group {} (columns {}): {e}",
                            self.path.display(),
                            self.next_group.saturating_sub(1),
                            self.columns_shown()
                        )));
                    }
                    None => {
                        self.reader = None;
                        let done = self
                            .next_group
                            .checked_sub(1)
                            .and_then(|g| self.meta.metadata().row_groups().get(g));
                        self.bytes +=
                            done.map_or(0, |g| u64::try_from(g.compressed_size()).unwrap_or(0));
                    }
                }
            }
            if self.next_group >= self.meta.metadata().num_row_groups() {
                return Ok(false);
            }
            let file = self.file.try_clone()?;
            let reader =
                ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.meta.clone())
                    .with_projection(self.projection.clone())
                    .with_row_groups(vec![self.next_group])
                    .with_batch_size(BATCH_ROWS)
                    .build()
                    .map_err(|e| {
                        ReadError::Input(format!(
                            "{}: cannot read row group {} (columns {}): {e}",
                            self.path.display(),
                            self.next_group,
                            self.columns_shown()
                        ))
                    })?;
            self.reader = Some(reader);
            self.next_group += 1;
        }
    }

    /// Takes the text and id columns of `batch` apart into strings.
    fn take(&mut self, batch: &RecordBatch) -> Result<(), ReadError> {
        let unreadable = |col: &Column, e: String| {
            ReadError::Input(format!(
                "{}: column {:?} (named by {}): {e}",
                self.path.display(),
                col.name,
                col.flag
            ))
        };
        let texts = column(batch, &self.text, false).map_err(|e| unreadable(&self.text, e))?;
        self.ids = match &self.id {
            Some(col) => Some(
                column(batch, col, true)
                    .map_err(|e| unreadable(col, e))?
                    .into_iter(),
            ),
            None => None,
        };
        self.texts = texts.into_iter();
        Ok(())
    }

    /// The columns read, for messages.
    fn columns_shown(&self) -> String {
        match &self.id {
            Some(id) if id.name != self.text.name => {
                format!("{:?} and {:?}", self.text.name, id.name)
            }
            _ => format!("{:?}", self.text.name),
        }
    }
}

impl RecordSource for ParquetSource {
    fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        if !self.fill()? {
            return Ok(None);
        }
        let row = self.row;
        self.row += 1;
        let bad = |problem: String| ReadError::Row {
            row: row + 1,
            problem,
        };
        // Both cells are taken before either is checked, so that the
        // columns stay in step after a refused row.
        let text = self.texts.next().flatten();
        let id = self.ids.as_mut().map(|ids| ids.next().flatten());
        let text = text.ok_or_else(|| {
            bad(format!(
                "the text column {:?} (--text-field) is null",
                self.text.name
            ))
        })?;
        let id = match (&self.id, id) {
            (Some(col), Some(id)) => Some(id.ok_or_else(|| {
                bad(format!("the id column {:?} (--id-field) is null", col.name))
            })?),
            _ => None,
        };
        // A prompt's position (its seed derives from it) counts records
        // taken, as in JSON Lines input.
        // A prompt leaves the record's `text` empty: keep it for the hash.
        let prompt = self.generation.is_some().then(|| text.clone());
        let record = text_record(text, id, self.taken, self.generation.as_ref()).map_err(bad)?;
        self.hash.add(
            record.id.as_deref(),
            prompt.as_deref().unwrap_or(&record.text),
        );
        self.taken += 1;
        Ok(Some(record))
    }

    fn bytes_read(&self) -> u64 {
        self.bytes
    }

    fn sha256_hex(self: Box<Self>) -> String {
        self.hash.hex()
    }
}

/// Whether values of `t` are taken as strings.
fn is_string(t: &DataType) -> bool {
    match t {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(key, value) => key.is_dictionary_key_type() && is_string(value),
        _ => false,
    }
}

/// Whether values of `t` are integers (ids only).
fn is_integer(t: &DataType) -> bool {
    t.is_integer()
}

/// Column `col` of `batch`, every row as a string (`None` for a null;
/// integers in decimal when `ints`).
fn column(batch: &RecordBatch, col: &Column, ints: bool) -> Result<Vec<Option<String>>, String> {
    let array = batch
        .column_by_name(&col.name)
        .ok_or_else(|| format!("column {:?} is missing from a record batch", col.name))?;
    if let DataType::Dictionary(_, _) = array.data_type() {
        let dict = array.as_any_dictionary();
        let keys = dict.normalized_keys();
        let values = dict.values();
        return (0..array.len())
            .map(|i| match keys.get(i) {
                Some(&k) if !array.is_null(i) => value(values, k, ints),
                _ => Ok(None),
            })
            .collect();
    }
    (0..array.len()).map(|i| value(array, i, ints)).collect()
}

/// Row `i` of `array` as a string (integers in decimal when `ints`);
/// `Ok(None)` for a null.
fn value(array: &ArrayRef, i: usize, ints: bool) -> Result<Option<String>, String> {
    if i >= array.len() || array.is_null(i) {
        return Ok(None);
    }
    let s = match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().value(i).to_owned(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(i).to_owned(),
        DataType::Utf8View => array.as_string_view().value(i).to_owned(),
        DataType::Int8 if ints => array.as_primitive::<Int8Type>().value(i).to_string(),
        DataType::Int16 if ints => array.as_primitive::<Int16Type>().value(i).to_string(),
        DataType::Int32 if ints => array.as_primitive::<Int32Type>().value(i).to_string(),
        DataType::Int64 if ints => array.as_primitive::<Int64Type>().value(i).to_string(),
        DataType::UInt8 if ints => array.as_primitive::<UInt8Type>().value(i).to_string(),
        DataType::UInt16 if ints => array.as_primitive::<UInt16Type>().value(i).to_string(),
        DataType::UInt32 if ints => array.as_primitive::<UInt32Type>().value(i).to_string(),
        DataType::UInt64 if ints => array.as_primitive::<UInt64Type>().value(i).to_string(),
        other => return Err(format!("a value of type {other} cannot be read as text")),
    };
    Ok(Some(s))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{
        DictionaryArray, Float64Array, Int64Array, LargeStringArray, StringArray, StringViewArray,
        UInt32Array,
    };
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::WriterProperties;

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn opts(text: &str, id: Option<&str>) -> ReadOptions {
        ReadOptions {
            text_field: text.into(),
            id_field: id.map(str::to_owned),
            max_line_bytes: 1 << 20,
            generation: None,
        }
    }

    /// Writes `columns` as a Parquet file of row groups of `group` rows.
    fn write(
        path: &Path,
        columns: Vec<(&str, ArrayRef)>,
        group: usize,
        compression: Compression,
    ) -> TestResult {
        let batch = RecordBatch::try_from_iter(columns)?;
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(group))
            .set_compression(compression)
            .build();
        let mut w = ArrowWriter::try_new(File::create(path)?, batch.schema(), Some(props))?;
        w.write(&batch)?;
        w.close()?;
        Ok(())
    }

    fn read_all(
        path: &Path,
        o: &ReadOptions,
    ) -> Result<(Vec<Record>, Box<dyn RecordSource>), ReadError> {
        let mut s: Box<dyn RecordSource> = Box::new(ParquetSource::open(path, o)?);
        let mut out = Vec::new();
        while let Some(r) = s.next_record()? {
            out.push(r);
        }
        Ok((out, s))
    }

    fn texts(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("text number {i}")).collect()
    }

    #[test]
    fn reads_string_ids_and_texts_across_row_groups() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("in.parquet");
        let t = texts(10);
        write(
            &path,
            vec![
                (
                    "score",
                    Arc::new(Float64Array::from(vec![0.5; 10])) as ArrayRef,
                ),
                ("body", Arc::new(StringArray::from(t.clone()))),
                (
                    "key",
                    Arc::new(StringArray::from_iter_values(
                        (0..10).map(|i| format!("k{i}")),
                    )),
                ),
            ],
            3,
            Compression::SNAPPY,
        )?;
        let groups = ParquetRecordBatchReaderBuilder::try_new(File::open(&path)?)?
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.compressed_size() as u64)
            .collect::<Vec<_>>();
        assert_eq!(groups.len(), 4, "10 rows in groups of 3");
        let (got, s) = read_all(&path, &opts("body", Some("key")))?;
        assert_eq!(got.iter().map(|r| r.text.clone()).collect::<Vec<_>>(), t);
        assert_eq!(got[7].id.as_deref(), Some("k7"));
        assert!(got.iter().all(|r| r.generation.is_none()));
        assert_eq!(s.bytes_read(), groups.iter().sum::<u64>());
        assert_eq!(s.sha256_hex().len(), 64);
        Ok(())
    }

    #[test]
    fn reads_integer_ids_and_every_string_type() -> TestResult {
        let dir = tempfile::tempdir()?;
        let t = texts(5);
        let cases: Vec<(&str, ArrayRef, ArrayRef)> = vec![
            (
                "large",
                Arc::new(LargeStringArray::from(t.clone())),
                Arc::new(Int64Array::from(vec![-2, 0, 7, 1 << 40, 9])),
            ),
            (
                "view",
                Arc::new(StringViewArray::from_iter_values(t.iter())),
                Arc::new(UInt32Array::from(vec![1, 2, 3, 4, u32::MAX])),
            ),
            (
                "dictionary",
                Arc::new(DictionaryArray::<arrow_array::types::Int32Type>::from_iter(
                    t.iter().map(String::as_str),
                )),
                Arc::new(DictionaryArray::<arrow_array::types::Int8Type>::from_iter(
                    ["a", "b", "a", "c", "b"],
                )),
            ),
        ];
        for (name, text, id) in cases {
            let path = dir.path().join(format!("{name}.parquet"));
            let kind = text.data_type().clone();
            write(
                &path,
                vec![("text", text), ("id", id)],
                2,
                Compression::ZSTD(Default::default()),
            )?;
            let (got, _) = read_all(&path, &opts("text", Some("id")))?;
            let read: Vec<String> = got.iter().map(|r| r.text.clone()).collect();
            assert_eq!(read, t, "{name} ({kind})");
            let ids: Vec<String> = got.iter().filter_map(|r| r.id.clone()).collect();
            let want: Vec<&str> = match name {
                "large" => vec!["-2", "0", "7", "1099511627776", "9"],
                "view" => vec!["1", "2", "3", "4", "4294967295"],
                _ => vec!["a", "b", "a", "c", "b"],
            };
            assert_eq!(ids, want, "{name}");
        }
        Ok(())
    }

    #[test]
    fn a_null_is_a_row_error_with_its_row_number() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("nulls.parquet");
        write(
            &path,
            vec![
                (
                    "text",
                    Arc::new(StringArray::from(vec![
                        Some("a"),
                        Some("b"),
                        None,
                        Some("d"),
                        Some("e"),
                    ])) as ArrayRef,
                ),
                (
                    "id",
                    Arc::new(Int64Array::from(vec![
                        Some(0),
                        Some(1),
                        Some(2),
                        Some(3),
                        None,
                    ])),
                ),
            ],
            2,
            Compression::UNCOMPRESSED,
        )?;
        let mut s = ParquetSource::open(&path, &opts("text", Some("id")))?;
        let mut seen = Vec::new();
        loop {
            match s.next_record() {
                Ok(Some(r)) => seen.push(format!("{}={}", r.id.unwrap_or_default(), r.text)),
                Ok(None) => break,
                Err(e) => seen.push(e.to_string()),
            }
        }
        assert_eq!(
            seen,
            vec![
                "0=a".to_owned(),
                "1=b".into(),
                "row 3: the text column \"text\" (--text-field) is null".into(),
                "3=d".into(),
                "row 5: the id column \"id\" (--id-field) is null".into(),
            ]
        );
        Ok(())
    }

    #[test]
    fn a_missing_column_is_named_with_the_columns_there_are() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("cols.parquet");
        write(
            &path,
            vec![
                ("body", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
                ("doc_id", Arc::new(Int64Array::from(vec![1]))),
            ],
            10,
            Compression::SNAPPY,
        )?;
        let e = ParquetSource::open(&path, &opts("text", None))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("cols.parquet has no column \"text\" (named by --text-field)")
                && e.contains("its columns are \"body\", \"doc_id\""),
            "{e}"
        );
        let e = ParquetSource::open(&path, &opts("body", Some("id")))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("no column \"id\" (named by --id-field)"), "{e}");
        Ok(())
    }

    #[test]
    fn a_column_of_the_wrong_type_is_named_with_its_type() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("types.parquet");
        write(
            &path,
            vec![
                ("body", Arc::new(StringArray::from(vec!["a"])) as ArrayRef),
                ("doc_id", Arc::new(Int64Array::from(vec![1]))),
                ("score", Arc::new(Float64Array::from(vec![1.0]))),
            ],
            10,
            Compression::SNAPPY,
        )?;
        let e = ParquetSource::open(&path, &opts("doc_id", None))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("column \"doc_id\" (named by --text-field) is of type Int64")
                && e.contains("a text column must hold strings"),
            "{e}"
        );
        let e = ParquetSource::open(&path, &opts("body", Some("score")))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("column \"score\" (named by --id-field) is of type Float64")
                && e.contains("or integers"),
            "{e}"
        );
        Ok(())
    }

    #[test]
    fn a_truncated_or_foreign_file_is_refused_by_name() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("whole.parquet");
        write(
            &path,
            vec![("text", Arc::new(StringArray::from(texts(100))) as ArrayRef)],
            10,
            Compression::SNAPPY,
        )?;
        let bytes = std::fs::read(&path)?;
        let cut = dir.path().join("cut.parquet");
        std::fs::write(&cut, &bytes[..bytes.len() / 2])?;
        let e = ParquetSource::open(&cut, &opts("text", None))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("cut.parquet is not a readable Parquet file"),
            "{e}"
        );
        let json = dir.path().join("lines.parquet");
        std::fs::write(&json, "{\"text\": \"a\"}\n")?;
        let e = ParquetSource::open(&json, &opts("text", None))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("lines.parquet is not a readable Parquet file"),
            "{e}"
        );
        // Pages damaged behind an intact footer: an error naming the file
        // and the column, never a panic or a silent short read.
        let mut bad = bytes.clone();
        for b in &mut bad[4..bytes.len() / 2] {
            *b = 0xA5;
        }
        let broken = dir.path().join("broken.parquet");
        std::fs::write(&broken, &bad)?;
        let r = read_all(&broken, &opts("text", None));
        let e = r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            e.contains("broken.parquet") && e.contains("\"text\""),
            "{e}"
        );
        Ok(())
    }

    #[test]
    fn the_hash_is_of_the_records_not_the_encoding() -> TestResult {
        let dir = tempfile::tempdir()?;
        let t = texts(50);
        let hash = |name: &str,
                    group: usize,
                    c: Compression,
                    ids: bool|
         -> Result<String, Box<dyn std::error::Error>> {
            let path = dir.path().join(name);
            write(
                &path,
                vec![
                    ("text", Arc::new(StringArray::from(t.clone())) as ArrayRef),
                    ("id", Arc::new(Int64Array::from_iter_values(0..50))),
                ],
                group,
                c,
            )?;
            let (_, s) = read_all(&path, &opts("text", ids.then_some("id")))?;
            Ok(s.sha256_hex())
        };
        let a = hash("a.parquet", 7, Compression::SNAPPY, true)?;
        let b = hash("b.parquet", 50, Compression::ZSTD(Default::default()), true)?;
        let c = hash("c.parquet", 7, Compression::SNAPPY, false)?;
        assert_eq!(a, b);
        assert_ne!(a, c);
        Ok(())
    }

    #[test]
    fn prompts_for_a_generation_model_get_the_job_defaults() -> TestResult {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("prompts.parquet");
        write(
            &path,
            vec![(
                "prompt",
                Arc::new(StringArray::from(vec!["hi", "there"])) as ArrayRef,
            )],
            1,
            Compression::SNAPPY,
        )?;
        let mut o = opts("prompt", None);
        o.generation = Some(crate::prompts::GenDefaults {
            max_tokens: 9,
            ..Default::default()
        });
        let (got, _) = read_all(&path, &o)?;
        assert_eq!(got.len(), 2);
        for r in &got {
            let g = r.generation.as_ref().ok_or("not a generation record")?;
            assert_eq!(g.params.max_tokens, 9);
            assert!(r.text.is_empty());
        }
        Ok(())
    }
}
