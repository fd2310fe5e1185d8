//! A real nats-server cluster on loopback: nodes `n1`..`nN`, each a
//! [`NatsServer`] with its own client port, route port and store, routed to
//! every other, JetStream on. Killable and restartable one by one.

use std::time::{Duration, Instant};

use crate::ports::ClosedPort;
use crate::{NatsServer, Result};

/// The cluster's name in every node's config.
pub const CLUSTER_NAME: &str = "minions-test";

/// Starts `n` routed servers and waits until their JetStream has a meta
/// leader (streams can be created).
///
/// Every node binds its own client and route ports. The first is routed to
/// a closed port the harness holds (JetStream runs clustered only with a
/// configured route) and each later one to the first's route port; they
/// learn the rest of the mesh from each other. Once all have bound, each
/// node's restart flags name its own ports and every node's route, as a
/// shipped config does.
pub async fn start(n: usize) -> Result<Vec<NatsServer>> {
    let anchor = ClosedPort::bind()?;
    let mut nodes: Vec<NatsServer> = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("n{}", i + 1);
        let seed = match nodes.first() {
            None => anchor.port()?,
            Some(first) => first
                .ports
                .cluster
                .ok_or("the first node reported no route port")?,
        };
        // The name goes with every start (`spawn_with`).
        let flags: Vec<String> = vec![
            "--cluster_name".into(),
            CLUSTER_NAME.into(),
            "--cluster".into(),
            "nats://127.0.0.1:-1".into(),
            "--routes".into(),
            format!("nats://127.0.0.1:{seed}"),
        ];
        let dir = tempfile::Builder::new()
            .prefix(&format!("minions-nats-{name}-"))
            .tempdir()?;
        let args: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (proc, ports) = NatsServer::spawn_with(dir.path(), &name, None, false, &args)?;
        let mut node = NatsServer::from_parts(proc, ports, None, name.clone(), dir);
        node.server_name = name;
        nodes.push(node);
    }
    let routes = nodes
        .iter()
        .map(|node| {
            node.ports
                .cluster
                .map(|p| format!("nats://127.0.0.1:{p}"))
                .ok_or_else(|| format!("{} reported no route port", node.server_name))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?
        .join(",");
    for node in &mut nodes {
        let route = node.ports.cluster.ok_or("no route port")?;
        node.keep = vec![
            "--cluster_name".into(),
            CLUSTER_NAME.into(),
            "--cluster".into(),
            format!("nats://127.0.0.1:{route}"),
            "--routes".into(),
            routes.clone(),
        ];
    }
    if let Some(first) = nodes.first_mut() {
        first.anchor = Some(anchor);
    }
    wait_ready(&url(&nodes), Duration::from_secs(30)).await?;
    Ok(nodes)
}

/// The URL list naming every node.
pub fn url(nodes: &[NatsServer]) -> String {
    nodes.iter().map(|n| n.url()).collect::<Vec<_>>().join(",")
}

/// A client that knows every node in `url` (a comma-separated list) and
/// moves to another when its server goes.
pub async fn client(url: &str) -> Result<async_nats::Client> {
    let servers = minions_endpoints::nats::server_addrs(url)?;
    Ok(async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connect(servers)
        .await?)
}

/// Waits until JetStream answers through `url` (a meta leader is elected).
pub async fn wait_ready(url: &str, within: Duration) -> Result<()> {
    let js = async_nats::jetstream::new(client(url).await?);
    let until = Instant::now() + within;
    loop {
        match js.query_account().await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > until => {
                return Err(format!("no JetStream meta leader within {within:?}: {e}").into());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The server leading the work stream (`what` = "work stream") or, for
/// anything else, job `job`'s consumer.
pub async fn work_leader(
    js: &async_nats::jetstream::Context,
    what: &str,
    job: &str,
) -> Result<String> {
    use minions_schemas::streams::WORK_STREAM;
    if what == "work stream" {
        stream_leader(js, WORK_STREAM, Duration::from_secs(10)).await
    } else {
        let consumer =
            minions_schemas::scheduling::job_consumer(&minions_schemas::JobId::new(job)?);
        consumer_leader(js, WORK_STREAM, &consumer, Duration::from_secs(10)).await
    }
}

/// The server name of the leader of `stream`, asked through `js` (retried
/// while an election is under way, up to `within`).
pub async fn stream_leader(
    js: &async_nats::jetstream::Context,
    stream: &str,
    within: Duration,
) -> Result<String> {
    let until = Instant::now() + within;
    loop {
        let leader = match js.get_stream(stream).await {
            Ok(mut s) => s
                .info()
                .await
                .ok()
                .and_then(|i| i.cluster.as_ref().and_then(|c| c.leader.clone())),
            Err(_) => None,
        };
        match leader {
            Some(l) if !l.is_empty() => return Ok(l),
            _ if Instant::now() > until => {
                return Err(format!("stream {stream} has no leader after {within:?}").into());
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The server name of the leader of `consumer` on `stream`.
pub async fn consumer_leader(
    js: &async_nats::jetstream::Context,
    stream: &str,
    consumer: &str,
    within: Duration,
) -> Result<String> {
    let until = Instant::now() + within;
    loop {
        let leader = match js.get_stream(stream).await {
            Ok(s) => match s
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(consumer)
                .await
            {
                Ok(mut c) => c
                    .info()
                    .await
                    .ok()
                    .and_then(|i| i.cluster.as_ref().and_then(|c| c.leader.clone())),
                Err(_) => None,
            },
            Err(_) => None,
        };
        match leader {
            Some(l) if !l.is_empty() => return Ok(l),
            _ if Instant::now() > until => {
                return Err(format!("consumer {consumer} has no leader after {within:?}").into());
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits until `stream` has a leader and every other replica is current
/// and online (a restarted server has caught up).
pub async fn wait_current(
    js: &async_nats::jetstream::Context,
    stream: &str,
    within: Duration,
) -> Result<()> {
    let until = Instant::now() + within;
    loop {
        let ok = match js.get_stream(stream).await {
            Ok(mut s) => s.info().await.ok().is_some_and(|i| {
                i.cluster.as_ref().is_some_and(|c| {
                    c.leader.is_some()
                        && c.replicas.len() + 1 == i.config.num_replicas
                        && c.replicas.iter().all(|p| p.current && !p.offline)
                })
            }),
            Err(_) => false,
        };
        if ok {
            return Ok(());
        }
        if Instant::now() > until {
            return Err(format!("{stream}: replicas not current within {within:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
