//! An axum service made a Pinboard worker by one layer: per-instance counters.
//!
//! - `GET /{ns}/{id}/count` increments the instance's counter:
//!   `{"ns","id","count","epoch","activated","session"}`; a counter restarts at 1 when its
//!   instance is (re)activated here;
//! - `GET /{ns}/{id}/ws`, a WebSocket: first `{"ns","id","epoch"}`, then each text message
//!   echoed as `echo:{text}`; once its instance is wound down, moved or evicted here it is
//!   closed 1012 with the reason (`epoch … ended`, `moved`), by `pinned_tower::ws::serve`, and
//!   logs `websocket ended`;
//! - `GET /healthz` is the service's own, passed through the layer untouched.
//!
//! Configured from the environment: `PINNED_REGISTRY` (the node's URL), `PINNED_TOKEN` or
//! `PINNED_TOKEN_FILE` (a `pinboard:worker` credential, the file read again whenever it
//! changes), `PINNED_NAMESPACES` (comma-separated, default `/threads`), `PINNED_LISTEN`
//! (default `127.0.0.1:0`), `PINNED_CLIENT_ID` (default `axum-example`), `PINNED_ADVERTISE_URL`
//! (default `http://` + the bound address).
//!
//! ```sh
//! PINNED_REGISTRY=http://127.0.0.1:8080 PINNED_TOKEN=$(cat /tmp/t) \
//!     cargo run -p pinned-tower --example axum
//! # listening 127.0.0.1:40123
//! # registered session=…
//! curl localhost:8080/threads/a/count
//! ```
//!
//! It prints `listening ADDR` once bound and `registered session=ID` on every (re)registration.
//! SIGTERM or SIGINT releases what it holds, deregisters, stops serving and exits 0. Superseded
//! it exits 1, its credential refused past its lease 4 (as `pinned-example` and the Python
//! runner); a configuration it cannot start with exits 2.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use pinned_tower::{Config, Event, Goodbye, Instance, Worker};
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

/// Each instance's count, and the epoch it counts at.
type Counters = Arc<Mutex<HashMap<(String, String), (String, u64)>>>;

async fn count(
    State(counters): State<Counters>,
    instance: Option<Extension<Instance>>,
) -> Response {
    // Only the layer's admitted instance requests carry one: a path of a namespace this worker
    // does not serve reached the router without.
    let Some(Extension(instance)) = instance else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let epoch = instance.epoch.as_str().to_owned();
    let count = {
        let mut counters = counters.lock().unwrap_or_else(|p| p.into_inner());
        let entry = counters
            .entry((instance.ns.clone(), instance.id.clone()))
            .or_insert_with(|| (epoch.clone(), 0));
        if instance.activated || entry.0 != epoch {
            *entry = (epoch.clone(), 0);
        }
        entry.1 += 1;
        entry.1
    };
    Json(json!({
        "ns": instance.ns, "id": instance.id, "count": count, "epoch": epoch,
        "activated": instance.activated,
    }))
    .into_response()
}

/// An instance's WebSocket: its greeting, then an echo, until the client leaves or the
/// instance's goodbye closes it.
async fn echo(
    ws: WebSocketUpgrade,
    instance: Option<Extension<Instance>>,
    goodbye: Option<Extension<Goodbye>>,
) -> Response {
    let (Some(Extension(instance)), Some(Extension(goodbye))) = (instance, goodbye) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    ws.on_upgrade(move |socket| async move {
        pinned_tower::ws::serve(socket, goodbye, async |socket| {
            greet_and_echo(socket, &instance).await;
        })
        .await;
        tracing::info!(ns = %instance.ns, id = %instance.id, "websocket ended");
    })
}

async fn greet_and_echo(socket: &mut WebSocket, instance: &Instance) {
    let greeting =
        json!({ "ns": instance.ns, "id": instance.id, "epoch": instance.epoch.as_str() });
    if socket
        .send(Message::Text(greeting.to_string().into()))
        .await
        .is_err()
    {
        return;
    }
    while let Some(Ok(message)) = socket.recv().await {
        if let Message::Text(text) = message {
            let echoed = format!("echo:{}", text.as_str());
            if socket.send(Message::Text(echoed.into())).await.is_err() {
                return;
            }
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PINNED_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let Some(registry) = env("PINNED_REGISTRY") else {
        eprintln!("axum example: PINNED_REGISTRY is not set");
        return ExitCode::from(2);
    };
    let listen = env("PINNED_LISTEN").unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("axum example: PINNED_LISTEN {listen}: {e}");
            return ExitCode::from(2);
        }
    };
    let addr = listener.local_addr().expect("a bound address");
    let namespaces = env("PINNED_NAMESPACES").unwrap_or_else(|| "/threads".into());
    let namespaces: Vec<&str> = namespaces.split(',').collect();
    let advertise = env("PINNED_ADVERTISE_URL").unwrap_or_else(|| format!("http://{addr}"));
    let client_id = env("PINNED_CLIENT_ID").unwrap_or_else(|| "axum-example".into());
    let token = env("PINNED_TOKEN").unwrap_or_default();
    let mut config = Config::new(&registry, &token, &client_id, &namespaces, &advertise);
    config.token_file = env("PINNED_TOKEN_FILE").map(Into::into);
    let (worker, mut events) = match Worker::start(config) {
        Ok(started) => started,
        Err(e) => {
            eprintln!("axum example: {e}");
            return ExitCode::from(2);
        }
    };

    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/{ns}/{id}/count", get(count))
        .route("/{ns}/{id}/ws", get(echo))
        .with_state(Counters::default())
        .layer(worker.layer());
    println!("listening {addr}");
    let (stop_serving, serving_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = serving_stopped.await;
            })
            .await
    });

    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        _ => {
            eprintln!("axum example: cannot install signal handlers");
            return ExitCode::from(2);
        }
    };
    let code = loop {
        tokio::select! {
            _ = term.recv() => break ExitCode::SUCCESS,
            _ = int.recv() => break ExitCode::SUCCESS,
            event = events.recv() => match event {
                Some(Event::Registered { session_id, .. }) => {
                    println!("registered session={session_id}");
                }
                // The worker logged why; a supervisor sees the exit status.
                Some(Event::Superseded { .. }) => break ExitCode::from(1),
                Some(Event::CredentialRefused { .. }) => break ExitCode::from(4),
                Some(_) => {}
                None => break ExitCode::from(1),
            },
        }
    };
    // Release and deregister while still serving, then stop serving.
    worker.shutdown().await;
    let _ = stop_serving.send(());
    let _ = server.await;
    code
}
