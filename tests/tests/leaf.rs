//! An office site as a leaf node: the shipped hub configs
//! (`deploy/nats/cluster/n1.conf`..`n3.conf`) run as three real
//! nats-servers, the shipped `leaf.conf` as a fourth that connects out to
//! them, each on free loopback ports with its own store. The streams are
//! created with three replicas on the hub, a job is submitted to the hub,
//! and a worker connected only to the leaf server runs every shard; the
//! collected vectors equal the in-process ones.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use minions_tests::ports::{ClosedPort, wait_logged_port, wait_nats};
use minions_tests::{
    Proc, Result, bin, job_events, max_abs_diff, minions_ok, minions_submit, push_tiny_model,
    read_npy_f32, scratch, tool, workspace_root, write_corpus,
};

/// The password the hub's `leafnodes` block reads from the environment.
const LEAF_PASSWORD: &str = "leaf-secret";

/// One nats-server started from a shipped config.
struct Server {
    proc: Proc,
    client: u16,
    http: u16,
}

/// `text` with its loopback ports moved: each `127.0.0.1:PORT` after
/// `listen: ` or `http: ` (a port this server binds) becomes `-1`, so that
/// the server binds one of its own choosing; every other one (a route to
/// another server, a leaf node's remote) becomes the port that server bound,
/// from `bound` (keyed by the shipped port), or `unknown` for a server not
/// started yet. One pass over the text, each port read whole: a port written
/// in is never read again, so a bound port whose digits begin with a shipped
/// one (42237 after 4223) is left as it is.
fn localize(text: &str, bound: &HashMap<u16, u16>, unknown: u16) -> String {
    const HOST: &str = "127.0.0.1:";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(HOST) {
        let (head, tail) = rest.split_at(at + HOST.len());
        out.push_str(head);
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        let (port, after) = tail.split_at(digits);
        let own = ["listen: ", "http: "]
            .iter()
            .any(|k| head.ends_with(&format!("{k}{HOST}")));
        match port.parse::<u16>() {
            Ok(_) if own => out.push_str("-1"),
            Ok(p) => out.push_str(&bound.get(&p).copied().unwrap_or(unknown).to_string()),
            Err(_) => out.push_str(port),
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Starts `deploy/nats/cluster/<name>.conf` in its own directory under
/// `dir` (its relative store_dir lands there), with the hub's secrets in
/// the environment, its own ports bound where it chooses and its routes and
/// remotes moved as [`localize`] says. `shipped` is its shipped client
/// port; the ports it bound are added to `bound` under the shipped ones
/// (client, route + 2000, leaf nodes + 3200, monitoring + 4000).
fn start(
    dir: &Path,
    name: &str,
    shipped: u16,
    bound: &mut HashMap<u16, u16>,
    unknown: u16,
) -> Result<Server> {
    let conf = workspace_root()
        .join("deploy/nats/cluster")
        .join(format!("{name}.conf"));
    let text = std::fs::read_to_string(&conf)?;
    let server_name = text
        .lines()
        .find_map(|l| l.strip_prefix("server_name: "))
        .ok_or_else(|| format!("{} names no server", conf.display()))?
        .trim()
        .to_owned();
    let text = localize(&text, bound, unknown)
        .replace("leaf:CHANGE-ME@", &format!("leaf:{LEAF_PASSWORD}@"));
    let home = dir.join(name);
    std::fs::create_dir_all(&home)?;
    let conf = home.join(format!("{name}.conf"));
    std::fs::write(&conf, text)?;
    let env = vec![
        ("MINIONS_SYS_PASSWORD".to_owned(), "sys-secret".to_owned()),
        ("MINIONS_LEAF_PASSWORD".to_owned(), LEAF_PASSWORD.to_owned()),
    ];
    let mut proc = Proc::spawn_in(
        name,
        &tool("NATS_SERVER_BIN", "nats-server")?,
        &[
            "-c".to_owned(),
            conf.display().to_string(),
            "--ports_file_dir".to_owned(),
            home.display().to_string(),
        ],
        &env,
        dir,
        Some(&home),
    )?;
    let ports = wait_nats(&mut proc, &home, &server_name, Duration::from_secs(15))
        .map_err(|e| format!("{name}: {e}"))?;
    let http = ports
        .monitoring
        .ok_or_else(|| format!("{name} serves no monitoring"))?;
    bound.insert(shipped, ports.client);
    bound.insert(shipped + 4000, http);
    if let Some(route) = ports.cluster {
        bound.insert(shipped + 2000, route);
    }
    if text_has_leaf_listener(&conf)? {
        // The ports file has no leaf node port; the server logs it.
        let leaf = wait_logged_port(
            &mut proc,
            0,
            "Listening for leafnode connections on",
            Duration::from_secs(15),
        )?;
        bound.insert(shipped + 3200, leaf);
    }
    Ok(Server {
        proc,
        client: ports.client,
        http,
    })
}

/// Whether the config at `conf` has a `leafnodes` block that listens.
fn text_has_leaf_listener(conf: &Path) -> Result<bool> {
    let text = std::fs::read_to_string(conf)?;
    Ok(text
        .split("leafnodes {")
        .nth(1)
        .is_some_and(|block| block.trim_start().starts_with("listen:")))
}

/// GETs `path` from the monitoring port `http` (empty on any failure).
fn monitor(http: u16, path: &str) -> String {
    minions_tests::web::get(&format!("http://127.0.0.1:{http}{path}"))
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// Polls `check` every 100 ms until it holds or `within` passes.
fn wait_until(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Result<()> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if check() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!("{what} not within {within:?}").into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_a_leaf_node_runs_the_hubs_shards() -> Result<()> {
    let started = Instant::now();
    let dir = scratch("minions-leaf-")?;
    // Each server binds its own ports; a route or remote to a server not
    // started yet points at a port held closed (the first hub server needs
    // a configured route; the others find the whole mesh through it).
    let closed = ClosedPort::bind()?;
    let mut bound = HashMap::new();
    let mut hub = Vec::new();
    for i in 1..=3u16 {
        hub.push(start(
            dir.path(),
            &format!("n{i}"),
            4221 + i,
            &mut bound,
            closed.port()?,
        )?);
    }
    let hub_urls = hub
        .iter()
        .map(|s| format!("nats://127.0.0.1:{}", s.client))
        .collect::<Vec<_>>()
        .join(",");
    // One of the three answers as JetStream's meta leader.
    let leader = || {
        hub.iter()
            .any(|s| monitor(s.http, "/jsz?leader-only=true").contains("\"meta_cluster\""))
    };
    wait_until("a JetStream meta leader", Duration::from_secs(30), leader).map_err(|e| {
        let logs: Vec<String> = hub.iter().map(|s| s.proc.log_tail(20)).collect();
        format!("{e}\n{}", logs.join("\n"))
    })?;
    eprintln!(
        "hub of 3 up with a meta leader after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let leaf = start(dir.path(), "leaf", 4230, &mut bound, closed.port()?)?;
    wait_until(
        "the leaf's connection to the hub",
        Duration::from_secs(20),
        || monitor(leaf.http, "/leafz").contains("\"leafnodes\": 1"),
    )
    .map_err(|e| format!("{e}\n{}", leaf.proc.log_tail(20)))?;

    let store = format!("file://{}", dir.path().join("store").display());
    let hub_env = vec![
        ("MINIONS_NATS_URL".to_owned(), hub_urls.clone()),
        ("MINIONS_STORE".to_owned(), store.clone()),
    ];
    minions_ok(&["admin", "init", "--replicas", "3"], &hub_env)?;

    // The work queue is replicated on all three hub servers.
    let client = minions_endpoints::nats::connect(
        &hub_urls,
        &minions_endpoints::nats::NatsSecurity::default(),
        "leaf-test",
    )
    .await?;
    let js = async_nats::jetstream::new(client);
    let mut work = js.get_stream(minions_schemas::streams::WORK_STREAM).await?;
    let info = work.info().await?;
    assert_eq!(info.config.num_replicas, 3, "{:?}", info.config);
    let replicas = info.cluster.as_ref().map_or(0, |c| c.replicas.len());
    assert_eq!(replicas, 2, "a leader and two replicas: {:?}", info.cluster);

    let model = push_tiny_model(dir.path(), &hub_env)?;
    let input = dir.path().join("input.jsonl");
    let texts = write_corpus(&input, 300)?;
    let job = minions_submit(
        &[("MINIONS_STORE".to_owned(), store.clone())],
        "tiny",
        &input,
        30,
        &["--job", "leaf1", "--nats", &hub_urls],
    )?;
    assert_eq!(job, "leaf1");

    // The worker knows only the leaf server.
    let leaf_url = format!("nats://127.0.0.1:{}", leaf.client);
    let worker = Proc::spawn(
        "worker",
        &bin("minions-worker")?,
        &[
            "--nats".into(),
            leaf_url.clone(),
            "--store".into(),
            store.clone(),
            "--cache-dir".into(),
            dir.path().join("cache").display().to_string(),
            "--name".into(),
            "site-w1".into(),
        ],
        &[
            ("RUST_LOG".to_owned(), "info".to_owned()),
            ("MINIONS_REPLICAS".to_owned(), "3".to_owned()),
        ],
        dir.path(),
    )?;
    let mut last = String::new();
    let done = wait_until("job leaf1 done", Duration::from_secs(60), || {
        last = minions_ok(&["status", &job, "--json"], &hub_env).unwrap_or_default();
        serde_json::from_str::<serde_json::Value>(&last)
            .is_ok_and(|v| v["state"] == "done" && v["done"] == 10)
    });
    if let Err(e) = done {
        return Err(format!(
            "{e}: {last}\n--- worker ---\n{}\n--- leaf ---\n{}",
            worker.log_tail(40),
            leaf.proc.log_tail(20)
        )
        .into());
    }
    eprintln!(
        "10 shards run by the leaf's worker; {:.1} s since the start",
        started.elapsed().as_secs_f64()
    );

    // Every shard went through the hub's queue: the leaf's own JetStream
    // holds nothing, and the worker's done events name it.
    assert!(
        monitor(leaf.http, "/jsz").contains("\"streams\": 0"),
        "the leaf's own JetStream holds streams: {}",
        monitor(leaf.http, "/jsz")
    );
    let workers = done_by(&js, &job).await?;
    assert!(workers.len() >= 10, "done events: {workers:?}");
    assert!(
        workers.iter().all(|w| w.starts_with("site-w1")),
        "done by others: {workers:?}"
    );

    let npy = dir.path().join("leaf1.npy");
    minions_ok(
        &["collect", &job, "--output", &npy.display().to_string()],
        &hub_env,
    )?;
    check_vectors(&npy, &model, &texts)?;
    // Acks reached the hub: the work queue ends empty.
    let until = Instant::now() + Duration::from_secs(10);
    while work.info().await?.state.messages != 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(work.info().await?.state.messages, 0, "work queue not empty");
    drop(worker);
    eprintln!("leaf test done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// The worker ids of `job`'s done events.
async fn done_by(js: &async_nats::jetstream::Context, job: &str) -> Result<Vec<String>> {
    Ok(job_events(js, job)
        .await?
        .into_iter()
        .filter(|e| matches!(e.kind, minions_schemas::messages::EventKind::Done { .. }))
        .map(|e| e.worker.to_string())
        .collect())
}

/// The collected vectors in `npy` equal (≤ 1e-5) the in-process ones of
/// `model` for `texts`.
fn check_vectors(npy: &Path, model: &Path, texts: &[String]) -> Result<()> {
    let (rows, _, got) = read_npy_f32(npy)?;
    assert_eq!(rows, texts.len());
    let want = minions_worker::model::BertEmbedder::load(
        model,
        &candle_core::Device::Cpu,
        minions_worker::model::Precision::F32,
    )?
    .embed(texts, minions_worker::model::Batching::texts(32))?;
    let diff = max_abs_diff(&got, &want);
    assert!(diff <= 1e-5, "collected vectors differ by {diff}");
    Ok(())
}

#[test]
fn localize_reads_each_port_whole_and_once() {
    let bound = HashMap::from([(6223u16, 42237u16), (4223, 40363), (7422, 4231)]);
    let text = "listen: 127.0.0.1:4222\nhttp: 127.0.0.1:8222\n  listen: 127.0.0.1:6222\n\
                a 127.0.0.1:6223\nb 127.0.0.1:4223\nc 127.0.0.1:42230 d 127.0.0.1:7422 \
                e 127.0.0.1:6224";
    assert_eq!(
        localize(text, &bound, 9),
        "listen: 127.0.0.1:-1\nhttp: 127.0.0.1:-1\n  listen: 127.0.0.1:-1\n\
         a 127.0.0.1:42237\nb 127.0.0.1:40363\nc 127.0.0.1:9 d 127.0.0.1:4231 \
         e 127.0.0.1:9"
    );
}
