//! `minions._native`: the Python client's native half. Every call runs the
//! same Rust code as the `minions` command line (submit, status, collect,
//! model push, cancel, worker list) on one Tokio runtime, with the GIL
//! released while it works or waits. The Python package `minions` wraps it
//! in the user-facing API (lists, pandas, Arrow in; numpy, Arrow out).
//!
//! Options arrive as the CLI's own flags and are parsed by the CLI's own
//! clap definitions, so defaults, ranges and error messages are the CLI's.

// PyO3's macros expand to code the workspace's `unsafe_code = "deny"`
// cannot see through; nothing in this file writes `unsafe` itself.
#![allow(unsafe_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use clap::Parser;
use minions::cli::{CollectArgs, Endpoints, ModelListArgs, ModelPushArgs, SubmitArgs};
use minions::commands::{self, collect::Gathered};
use minions::input::Input;
use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

create_exception!(
    _native,
    MinionsError,
    PyRuntimeError,
    "A Minions operation failed; the message is the one the command line prints."
);

/// The runtime every call runs on (two threads: calls are I/O-bound).
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("minions")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| MinionsError::new_err(format!("cannot start the client's runtime: {e}")))
}

/// Runs `f` on the runtime with the GIL released; an error becomes a
/// `MinionsError` carrying the CLI's message (with its causes), and with
/// `MINIONS_DEBUG=1` the causes one per line and the backtrace, as the
/// CLI's `-v` prints them.
fn block<T, F>(py: Python<'_>, f: F) -> PyResult<T>
where
    T: Send,
    F: std::future::Future<Output = anyhow::Result<T>> + Send,
{
    let rt = runtime()?;
    py.detach(|| rt.block_on(f)).map_err(|e| {
        let text = minions_endpoints::exit::describe(&e, minions_endpoints::exit::debug_from_env());
        MinionsError::new_err(text.strip_prefix("error: ").unwrap_or(&text).to_owned())
    })
}

/// A clap error as one line (the CLI's message, without usage text).
fn flag_error(e: &clap::Error) -> PyErr {
    let text = e.to_string();
    let first = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid option")
        .trim_start_matches("error: ")
        .to_owned();
    pyo3::exceptions::PyValueError::new_err(first)
}

#[derive(Parser)]
#[command(name = "minions")]
struct EndpointFlags {
    #[command(flatten)]
    endpoints: Endpoints,
}

#[derive(Parser)]
#[command(name = "minions submit")]
struct SubmitFlags {
    #[command(flatten)]
    args: SubmitArgs,
}

/// Reads the CLI's debug logs into stderr when `RUST_LOG` asks for them;
/// quiet (warnings only) otherwise.
fn init_logging() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        // Another library may have installed a subscriber: keep theirs.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    });
}

/// A connection profile: where the fleet's NATS and store are. Opening
/// one connects to nothing; each call connects for its own work.
#[pyclass(module = "minions._native", frozen)]
struct Fleet {
    endpoints: Endpoints,
}

#[pymethods]
impl Fleet {
    /// Settings from `flags` (the CLI's global flags, e.g. `["--nats",
    /// URL, "--store", URL]`), then the `MINIONS_*` environment variables,
    /// then the settings file, exactly as the CLI resolves them.
    #[new]
    fn new(flags: Vec<String>) -> PyResult<Self> {
        init_logging();
        let argv = std::iter::once("minions".to_owned()).chain(flags);
        let mut parsed = EndpointFlags::try_parse_from(argv).map_err(|e| flag_error(&e))?;
        let e = &mut parsed.endpoints;
        minions_endpoints::config_file::apply(&mut e.nats, &mut e.store, &mut e.security)
            .map_err(|err| MinionsError::new_err(err.to_string()))?;
        Ok(Self {
            endpoints: parsed.endpoints,
        })
    }

    /// The NATS URL(s) in use.
    #[getter]
    fn nats(&self) -> String {
        self.endpoints.nats.clone()
    }

    /// The store URL in use.
    #[getter]
    fn store(&self) -> String {
        self.endpoints.store_url()
    }

    /// `minions model push PATH --name NAME`; returns the model's hash.
    fn push_model(&self, py: Python<'_>, path: PathBuf, name: String) -> PyResult<String> {
        let args = ModelPushArgs { dir: path, name };
        let ep = &self.endpoints;
        block(py, async move {
            Ok(commands::model::push(ep, args).await?.hash.to_string())
        })
    }

    /// `minions model list --json`.
    fn list_models(&self, py: Python<'_>) -> PyResult<String> {
        let ep = &self.endpoints;
        block(py, commands::model::list(ep, &ModelListArgs { json: true }))
    }

    /// Submits texts held in memory (prompts, for a generation model) with
    /// optional ids; `flags` are `minions submit`'s (`--model` included).
    /// Returns the submit report as a dict.
    #[pyo3(signature = (flags, texts, ids=None, source=None))]
    fn submit_texts<'py>(
        &self,
        py: Python<'py>,
        flags: Vec<String>,
        texts: Vec<String>,
        ids: Option<Vec<String>>,
        source: Option<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let args = submit_flags(flags, "<memory>")?;
        let input = Input::Texts {
            source: source.unwrap_or_else(|| format!("{} texts from Python", texts.len())),
            texts,
            ids,
        };
        let ep = &self.endpoints;
        let report = block(py, commands::submit::submit(ep, &args, input))?;
        report_dict(py, &report)
    }

    /// Submits a file (JSON Lines or Parquet, local or `s3://`), exactly as
    /// `minions submit --input PATH` with `flags`.
    fn submit_file<'py>(
        &self,
        py: Python<'py>,
        flags: Vec<String>,
        path: String,
    ) -> PyResult<Bound<'py, PyDict>> {
        let args = submit_flags(flags, &path)?;
        let ep = &self.endpoints;
        let report = block(py, commands::submit::run(ep, args))?;
        report_dict(py, &report)
    }

    /// `minions status JOB --json`.
    fn status(&self, py: Python<'_>, job: String) -> PyResult<String> {
        let ep = &self.endpoints;
        block(py, async move {
            let args = minions::cli::StatusArgs { job, json: true };
            Ok(commands::status::run(ep, &args).await?.1)
        })
    }

    /// `minions cancel JOB`; returns its summary line.
    fn cancel(&self, py: Python<'_>, job: String) -> PyResult<String> {
        let ep = &self.endpoints;
        block(
            py,
            async move { commands::job_control::cancel(ep, &job).await },
        )
    }

    /// `minions worker list --json`.
    fn workers(&self, py: Python<'_>) -> PyResult<String> {
        let ep = &self.endpoints;
        block(py, commands::worker::list(ep, true))
    }

    /// A complete job's results in input order: for an embedding job
    /// `("vectors", ids or None, dim, bytes of rows × dim little-endian
    /// float32)`, for a generation job `("generations", ids, JSON list of
    /// results)`, for a speech job `("transcripts", None, JSON list of
    /// transcripts)` (each with its id).
    fn gather<'py>(&self, py: Python<'py>, job: String) -> PyResult<Bound<'py, PyAny>> {
        let ep = &self.endpoints;
        let gathered = block(py, async move { commands::collect::gather(ep, &job).await })?;
        match gathered {
            Gathered::Vectors { ids, dim, data } => {
                let bytes = PyBytes::new(py, &data);
                Ok(("vectors", ids, dim, bytes).into_pyobject(py)?.into_any())
            }
            Gathered::Generations { ids, results } => {
                let json = serde_json::to_string(&results)
                    .map_err(|e| MinionsError::new_err(e.to_string()))?;
                Ok(("generations", ids, json).into_pyobject(py)?.into_any())
            }
            Gathered::Transcripts { lines } => {
                let json = serde_json::to_string(&lines)
                    .map_err(|e| MinionsError::new_err(e.to_string()))?;
                Ok(("transcripts", None::<Vec<String>>, json)
                    .into_pyobject(py)?
                    .into_any())
            }
        }
    }

    /// `minions collect JOB --output PATH [--format F]`; returns the
    /// report as a dict (`rows`, `dim`, `errors`).
    #[pyo3(signature = (job, output, format=None))]
    fn collect_to<'py>(
        &self,
        py: Python<'py>,
        job: String,
        output: PathBuf,
        format: Option<String>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let format = match format.as_deref() {
            None | Some("jsonl") => minions::cli::CollectFormat::Jsonl,
            Some("openai") => minions::cli::CollectFormat::Openai,
            Some("srt") => minions::cli::CollectFormat::Srt,
            Some("vtt") => minions::cli::CollectFormat::Vtt,
            Some(other) => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "format {other:?}: use \"jsonl\", \"openai\" (generation jobs), or \"srt\" or \"vtt\" (speech jobs, a folder of subtitles)"
                )));
            }
        };
        let args = CollectArgs {
            job,
            output,
            format,
        };
        let ep = &self.endpoints;
        let r = block(py, async move { commands::collect::run(ep, &args).await })?;
        let d = PyDict::new(py);
        d.set_item("rows", r.rows)?;
        d.set_item("dim", r.dim)?;
        d.set_item("errors", r.errors)?;
        Ok(d)
    }
}

/// `minions submit`'s flags parsed by its own definitions, `--input` set.
fn submit_flags(flags: Vec<String>, input: &str) -> PyResult<SubmitArgs> {
    let argv = [
        "minions submit".to_owned(),
        "--input".to_owned(),
        input.to_owned(),
    ]
    .into_iter()
    .chain(flags);
    SubmitFlags::try_parse_from(argv)
        .map(|f| f.args)
        .map_err(|e| flag_error(&e))
}

fn report_dict<'py>(
    py: Python<'py>,
    r: &commands::submit::SubmitReport,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("job", r.job.as_str())?;
    d.set_item("records", r.records)?;
    d.set_item("shards", r.shards)?;
    d.set_item("published", r.published)?;
    d.set_item("duplicates", r.duplicates)?;
    d.set_item("already_done", r.already_done)?;
    d.set_item("skipped", r.skipped)?;
    Ok(d)
}

/// The module `minions._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Fleet>()?;
    m.add("MinionsError", m.py().get_type::<MinionsError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
