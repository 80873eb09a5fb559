//! `scripts/bench`'s bare worker: the cheapest worker Pinboard will place instances on, so that a
//! bench leg measures the proxy in front of it and not the worker behind it (issue 25). One
//! tokio thread (current_thread) serves HTTP/1.1 with keep-alive (hyper) and answers every
//! instance request with the same 13 bytes.
//!
//! It does the least of the worker protocol that gets it placed and keeps it placed: it
//! registers with a worker token, answers the node's `/_pinned/challenge` probe with its one
//! challenge value, and heartbeats every third of the lease (registering again when the node
//! has lost the session). It verifies nothing, on purpose: no attestation, no epoch, no proxy
//! secret, so that every leg (direct, through Pinboard, nginx, HAProxy, the Lua peer) costs the
//! worker the same and the peers that sign nothing need no tokens. It is a measuring
//! instrument, never a worker to deploy: anyone who reaches it is answered.
//!
//! ```text
//! BARE_WORKER_TOKEN=… bare-worker --registry http://127.0.0.1:8080 \
//!     --listen 127.0.0.1:9000 --namespace /bare [--client-id bare-worker]
//! ```
//!
//! Prints `registered session=…` on stdout at each registration. The registry is plain HTTP.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

/// What every instance request is answered, 13 bytes.
const BODY: &[u8] = b"hello, world\n";
/// Past anything a bench places: the node never runs out of room on this worker.
const HEADROOM: u64 = 1_000_000;
/// Between tries of a registry call that did not get through.
const RETRY: Duration = Duration::from_millis(500);

struct Settings {
    /// `host:port` and base path of the registry (`http://host:port/base`).
    registry_authority: String,
    registry_base: String,
    token: String,
    listen: SocketAddr,
    namespace: String,
    client_id: String,
    secret: String,
    /// The one challenge this worker sends, and its value, for its whole life: the probe is
    /// answered the value whatever it asks.
    challenge: String,
    challenge_value: String,
}

fn main() {
    let settings = match settings(std::env::args().skip(1)) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("bare-worker: {error}");
            std::process::exit(2);
        }
    };
    let settings: &'static Settings = Box::leak(Box::new(settings));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let listener = TcpListener::bind(settings.listen)
            .await
            .unwrap_or_else(|e| panic!("cannot listen on {}: {e}", settings.listen));
        tokio::spawn(keep_registered(settings));
        serve(listener, settings).await;
    });
}

fn settings(mut args: impl Iterator<Item = String>) -> Result<Settings, String> {
    let (mut registry, mut listen, mut namespace) = (None, None, None);
    let mut client_id = "bare-worker".to_owned();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--registry" => registry = Some(value),
            "--listen" => listen = Some(value),
            "--namespace" => namespace = Some(value),
            "--client-id" => client_id = value,
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    let registry = registry.ok_or("--registry is required")?;
    let rest = registry
        .strip_prefix("http://")
        .ok_or("--registry must be an http:// URL")?;
    let (authority, base) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let listen = listen
        .ok_or("--listen is required")?
        .parse()
        .map_err(|e| format!("--listen: {e}"))?;
    let token = std::env::var("BARE_WORKER_TOKEN").map_err(|_| "BARE_WORKER_TOKEN is not set")?;
    // Not secrets worth the name (nothing is verified with them): distinct per process.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let unique = format!("{nanos:x}{:x}", std::process::id());
    Ok(Settings {
        registry_authority: authority.to_owned(),
        registry_base: base.trim_end_matches('/').to_owned(),
        token,
        listen,
        namespace: namespace.ok_or("--namespace is required")?,
        client_id,
        secret: format!("bare-secret-{unique}"),
        challenge: format!("c{unique}"),
        challenge_value: format!("v{unique}"),
    })
}

/// Every connection on its own task, keep-alive (hyper's default), Nagle off as every proxy in
/// front of it has it.
async fn serve(listener: TcpListener, settings: &'static Settings) {
    let challenge_answer = Bytes::from(json!({"value": settings.challenge_value}).to_string());
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                eprintln!("bare-worker: accept: {error}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let challenge_answer = challenge_answer.clone();
        tokio::spawn(async move {
            let answer = service_fn(move |request: Request<Incoming>| {
                let body = if request.uri().path() == "/_pinned/challenge" {
                    challenge_answer.clone()
                } else {
                    Bytes::from_static(BODY)
                };
                async move { Ok::<_, Infallible>(Response::new(Full::new(body))) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), answer)
                .await;
        });
    }
}

/// Registers, then heartbeats every third of the lease; registers again when the node answers
/// that it lost the session (409 `reregister`). Calls that fail otherwise are retried.
async fn keep_registered(settings: &'static Settings) {
    loop {
        let (session, lease) = register(settings).await;
        println!("registered session={session}");
        let mut wait = lease / 3;
        loop {
            tokio::time::sleep(wait).await;
            let body = json!({
                "sessionId": session, "headroom": HEADROOM, "draining": false,
                "challenge": settings.challenge, "challengeValue": settings.challenge_value,
            });
            match post(settings, "heartbeat", &body).await {
                Ok((status, _)) if status.is_success() => wait = lease / 3,
                Ok((StatusCode::CONFLICT, answer)) if answer["reregister"] == true => break,
                outcome => {
                    eprintln!("bare-worker: heartbeat: {outcome:?}");
                    wait = RETRY;
                }
            }
        }
    }
}

/// The session id and the lease of a successful registration, tried until one succeeds.
async fn register(settings: &'static Settings) -> (String, Duration) {
    let body = json!({
        "clientId": settings.client_id, "secret": settings.secret,
        "namespaces": [settings.namespace],
        "advertiseUrl": format!("http://{}", settings.listen),
        "headroom": HEADROOM, "draining": false,
        "challenge": settings.challenge, "challengeValue": settings.challenge_value,
    });
    loop {
        match post(settings, "register", &body).await {
            Ok((status, answer)) if status.is_success() => {
                if let (Some(session), Some(lease)) =
                    (answer["sessionId"].as_str(), answer["expiresInMs"].as_u64())
                {
                    return (session.to_owned(), Duration::from_millis(lease));
                }
                eprintln!("bare-worker: register: unexpected answer {answer}");
            }
            outcome => eprintln!("bare-worker: register: {outcome:?}"),
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// `POST {registry}/registry/{route}` with the worker token, on a connection of its own: the
/// answer's status and JSON body (`null` when it is not JSON).
async fn post(
    settings: &Settings,
    route: &str,
    body: &Value,
) -> Result<(StatusCode, Value), String> {
    let stream = TcpStream::connect(&settings.registry_authority)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(connection);
    let request = Request::post(format!("{}/registry/{route}", settings.registry_base))
        .header(HOST, &settings.registry_authority)
        .header(AUTHORIZATION, format!("Bearer {}", settings.token))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| format!("request: {e}"))?;
    let answer = sender
        .send_request(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = answer.status();
    let bytes = answer
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("read: {e}"))?
        .to_bytes();
    Ok((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}
