//! The HTTPS transport against an in-test TLS server: authentication, rotation, budgets,
//! admission and connection reuse.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tak_os_lease_client::Failure;
use tak_os_lease_client::protocol::{AccessMode, FileId, ROOT_INO, VolumeGeneration};
use tak_os_lease_client::v1::request::Op;
use tak_os_lease_client::{
    Budgets, Client, ClientConfig, Credentials, EndpointSet, Error, HttpsTransport, v1,
};

use crate::server::{Pki, TestCa, TestServer, silent_endpoint};

const TOKEN: &str = "token-one";

fn budgets() -> Budgets {
    // A tenth of the defaults: 1.5 s per call, 300 ms per attempt.
    Budgets::default().scaled(0.1)
}

fn client(
    endpoints: &[&str],
    budgets: Budgets,
    credentials: &Credentials,
) -> Client<HttpsTransport> {
    let config = ClientConfig {
        volume_id: "vol-tls".into(),
        volume_generation: VolumeGeneration(1),
        access_mode: AccessMode::Rwx,
        endpoints: EndpointSet::new(endpoints).unwrap(),
        budgets,
    };
    Client::new(
        config,
        HttpsTransport::with_credentials(&budgets, credentials),
    )
}

fn credentials(pki: &Pki, token: &str) -> Credentials {
    Credentials::from_pem(
        token,
        pki.ca.pem.as_bytes(),
        pki.client.cert_pem.as_bytes(),
        pki.client.key_pem.as_bytes(),
    )
    .unwrap()
}

fn getattr() -> Op {
    Op::Getattr(v1::GetattrRequest {
        file: Some(
            FileId {
                ino: ROOT_INO,
                inode_generation: 0,
            }
            .into(),
        ),
        handle: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_call_succeeds_with_a_ca_bundle_of_several_certificates() {
    let pki = Pki::new();
    let server = TestServer::start(&pki.server, &pki.ca.pem, TOKEN).await;
    let other = TestCa::new("unrelated CA");
    let bundle = format!("{}{}", other.pem, pki.ca.pem);
    let credentials = Credentials::from_pem(
        TOKEN,
        bundle.as_bytes(),
        pki.client.cert_pem.as_bytes(),
        pki.client.key_pem.as_bytes(),
    )
    .unwrap();
    assert_eq!(credentials.ca_certificates(), 2);
    assert!(
        !format!("{credentials:?}").contains(TOKEN),
        "Debug leaks the token"
    );

    let client = client(&[&server.endpoint], budgets(), &credentials);
    let result = client.call(getattr()).await.unwrap();
    let v1::reply::Result::Getattr(entry) = result else {
        panic!("unexpected result {result:?}")
    };
    assert_eq!(entry.file.unwrap().ino, ROOT_INO);
    assert_eq!(server.state.answered.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_wrong_token_is_refused() {
    let pki = Pki::new();
    let server = TestServer::start(&pki.server, &pki.ca.pem, TOKEN).await;
    let client = client(
        &[&server.endpoint],
        budgets(),
        &credentials(&pki, "not-the-token"),
    );
    let started = Instant::now();
    let err = client.call(getattr()).await.unwrap_err();
    assert!(matches!(err, Error::Unauthorized { .. }), "{err:?}");
    assert!(err.is_definite());
    assert!(
        started.elapsed() < budgets().call,
        "a refused token is final at once"
    );
    assert_eq!(server.state.answered.load(Ordering::SeqCst), 0);
    assert!(!err.to_string().contains("not-the-token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_certificate_from_another_ca_is_refused() {
    let pki = Pki::new();
    let server = TestServer::start(&pki.server, &pki.ca.pem, TOKEN).await;
    let rogue = TestCa::new("rogue CA").client_leaf();
    let credentials = Credentials::from_pem(
        TOKEN,
        pki.ca.pem.as_bytes(),
        rogue.cert_pem.as_bytes(),
        rogue.key_pem.as_bytes(),
    )
    .unwrap();
    let client = client(&[&server.endpoint], budgets(), &credentials);
    let err = client.call(getattr()).await.unwrap_err();
    // With TLS 1.3 the client learns of the refusal only when the connection closes under
    // its first request; whether hyper reports that as "not written" or as a broken pipe
    // (which on HTTP/2 cannot be told from a delivered request) is a race.
    assert!(
        matches!(
            err,
            Error::Unavailable {
                last: Failure::Tls | Failure::Connection,
                ..
            } | Error::Uncertain { .. }
        ),
        "{err:?}"
    );
    assert_eq!(server.state.answered.load(Ordering::SeqCst), 0);
    assert_eq!(server.state.connections.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_server_certificate_from_an_untrusted_ca_is_refused() {
    let pki = Pki::new();
    let server = TestServer::start(&pki.server, &pki.ca.pem, TOKEN).await;
    let stranger = TestCa::new("stranger CA");
    let credentials = Credentials::from_pem(
        TOKEN,
        stranger.pem.as_bytes(),
        pki.client.cert_pem.as_bytes(),
        pki.client.key_pem.as_bytes(),
    )
    .unwrap();
    let client = client(&[&server.endpoint], budgets(), &credentials);
    let err = client.call(getattr()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Unavailable {
                last: Failure::Tls,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(server.state.answered.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_token_rotation_under_load_loses_no_call() {
    let pki = Pki::new();
    let server = TestServer::start(&pki.server, &pki.ca.pem, TOKEN).await;
    let old = credentials(&pki, TOKEN);
    let client = client(&[&server.endpoint], Budgets::default().scaled(0.2), &old);

    let callers: Vec<_> = (0..16)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                for _ in 0..40 {
                    client.call(getattr()).await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();

    // The rotation as it happens in the field: the worker accepts the new token too, the
    // client switches, and only then does the worker drop the old one. Calls in flight with
    // the old token are refused and retried with the new one.
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.state.accept_token("token-two");
    client
        .transport()
        .set_credentials(&old.with_token("token-two").unwrap());
    server.state.revoke_token(TOKEN);

    for caller in callers {
        caller.await.unwrap().unwrap();
    }
    assert_eq!(server.state.answered.load(Ordering::SeqCst), 16 * 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_endpoint_that_never_answers_costs_one_budget() {
    let pki = Pki::new();
    let (silent, _task) = silent_endpoint().await;
    let budgets = budgets();
    let client = client(&[&silent], budgets, &credentials(&pki, TOKEN));
    let started = Instant::now();
    let err = client.call(getattr()).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(
        elapsed <= budgets.call + Duration::from_millis(200),
        "took {elapsed:?}"
    );
    assert!(
        elapsed >= budgets.call - Duration::from_millis(50),
        "gave up early: {elapsed:?}"
    );
    // The TLS handshake never finished, but the client cannot know how far a request got
    // once its attempt timed out.
    assert!(matches!(err, Error::Uncertain { .. }), "{err:?}");

    // With a working endpoint beside it, the call rotates to that one.
    let server = TestServer::start(&pki.server, &pki.ca.pem, TOKEN).await;
    let client = self::client(
        &[&silent, &server.endpoint],
        budgets,
        &credentials(&pki, TOKEN),
    );
    let started = Instant::now();
    client.call(getattr()).await.unwrap();
    assert!(started.elapsed() < budgets.call);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_admission_holds_64_calls_on_one_connection() {
    let pki = Pki::new();
    let server = TestServer::start(&pki.server, &pki.ca.pem, TOKEN).await;
    let budgets = Budgets {
        call: Duration::from_secs(20),
        attempt: Duration::from_secs(20),
        ..Budgets::default()
    };
    let client = client(&[&server.endpoint], budgets, &credentials(&pki, TOKEN));
    // Warm the connection so every call shares it.
    client.call(getattr()).await.unwrap();

    server.state.set_gate(false);
    let held: Vec<_> = (0..64)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.call(getattr()).await })
        })
        .collect();
    let waiting_since = Instant::now();
    while server.state.in_flight() < 64 {
        assert!(
            waiting_since.elapsed() < Duration::from_secs(10),
            "64 calls never arrived"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // The 65th caller waits for a slot inside its own budget and gives up when it ends.
    let extra = client.prepare(getattr()).unwrap();
    let started = Instant::now();
    let err = client
        .send_until(&extra, started + Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_millis(600));
    assert_eq!(server.state.in_flight(), 64);

    server.state.set_gate(true);
    for call in held {
        call.await.unwrap().unwrap();
    }
    assert_eq!(server.state.max_in_flight.load(Ordering::SeqCst), 64);
    assert_eq!(
        server.state.connections.load(Ordering::SeqCst),
        1,
        "HTTP/2 carries every call on one connection"
    );
}

/// Not a benchmark, a smoke figure: sequential and 64-way getattr over loopback TLS.
/// Run with `--no-capture` to see the numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_throughput_smoke() {
    let pki = Pki::new();
    let server = TestServer::start(&pki.server, &pki.ca.pem, TOKEN).await;
    let client = client(
        &[&server.endpoint],
        Budgets::default(),
        &credentials(&pki, TOKEN),
    );
    client.call(getattr()).await.unwrap();

    let started = Instant::now();
    for _ in 0..500 {
        client.call(getattr()).await.unwrap();
    }
    let sequential = 500.0 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let client = Arc::new(client);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let client = Arc::clone(&client);
            tokio::spawn(async move {
                for _ in 0..40 {
                    client.call(getattr()).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let parallel = (64.0 * 40.0) / started.elapsed().as_secs_f64();
    println!(
        "getattr over loopback TLS: {sequential:.0} calls/s sequential, {parallel:.0} calls/s with 64 callers"
    );
    assert_eq!(server.state.connections.load(Ordering::SeqCst), 1);
}

/// A runtime on a thread of its own until the returned sender is dropped or fires.
fn runtime_on_a_thread(
    runtime: tokio::runtime::Runtime,
) -> (
    tokio::runtime::Handle,
    tokio::sync::oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
) {
    let handle = runtime.handle().clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let _ = runtime.block_on(stopped);
    });
    (handle, stop, thread)
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn tls_connections_run_on_the_runtime_the_transport_names() {
    let pki = Pki::new();
    let (servers, stop_servers, servers_thread) = runtime_on_a_thread(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap(),
    );
    let server = servers.block_on(TestServer::start(&pki.server, &pki.ca.pem, TOKEN));
    // The named runtime: single-threaded, on a thread of its own, as a FUSE server's is.
    let (named, stop_named, named_thread) = runtime_on_a_thread(current_thread());

    let budgets = budgets();
    let transport = HttpsTransport::on_runtime(&budgets, named.clone());
    transport.set_credentials(&credentials(&pki, TOKEN));
    let config = ClientConfig {
        volume_id: "vol-tls".into(),
        volume_generation: VolumeGeneration(1),
        access_mode: AccessMode::Rwx,
        endpoints: EndpointSet::new([server.endpoint.as_str()]).unwrap(),
        budgets,
    };
    let client = Client::new(config, transport);
    assert_eq!(named.metrics().num_alive_tasks(), 0);

    // The first call comes from a runtime that then shuts down: the connection it opened
    // (socket, TLS and HTTP/2 tasks) lives on the named runtime, so it goes on serving.
    let elsewhere = current_thread();
    elsewhere.block_on(client.call(getattr())).unwrap();
    drop(elsewhere);
    assert!(
        named.metrics().num_alive_tasks() >= 1,
        "no task of the connection runs on the named runtime"
    );
    let later = current_thread();
    for _ in 0..3 {
        later.block_on(client.call(getattr())).unwrap();
    }
    assert_eq!(server.state.answered.load(Ordering::SeqCst), 4);
    assert_eq!(
        server.state.connections.load(Ordering::SeqCst),
        1,
        "the first connection broke when the runtime that opened it shut down"
    );

    drop(client);
    stop_named.send(()).unwrap();
    named_thread.join().unwrap();
    drop(server);
    stop_servers.send(()).unwrap();
    servers_thread.join().unwrap();
}
