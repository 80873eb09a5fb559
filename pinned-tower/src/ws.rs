//! WebSockets of axum apps behind the layer (feature `axum`): [`serve`] runs one until the app
//! is done with it or its instance's [`Goodbye`] comes (the instance wound down, moved or
//! evicted here), then sends the close the goodbye says (1012, `epoch … ended` or `moved`),
//! so that the client reconnects rather than sees a reset.
//!
//! The layer cannot do it unseen: hyper hands the upgraded connection to whoever awaits the
//! request's upgrade (axum's `WebSocketUpgrade`), not to the layer. So the layer puts the
//! [`Goodbye`] in the request's extensions, and the app hands it here with the socket.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use pinboard_protocol::worker::goodbye::Goodbye;

/// How long, after its close frame, the client's answer is waited for before the connection
/// is dropped.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Runs `app` on `socket` until it returns, or until `goodbye` comes: then `app` is dropped
/// (its pending receive or send is cancelled; a frame half sent is finished first, by the
/// socket's own buffer) and the socket is closed with the goodbye's code and reason, the
/// client's answering close read for a second at most.
///
/// ```no_run
/// use axum::extract::ws::{Message, WebSocketUpgrade};
/// use axum::response::Response;
/// use axum::Extension;
/// use pinned_tower::Goodbye;
///
/// async fn echo(ws: WebSocketUpgrade, Extension(goodbye): Extension<Goodbye>) -> Response {
///     ws.on_upgrade(move |socket| {
///         pinned_tower::ws::serve(socket, goodbye, async |socket| {
///             while let Some(Ok(Message::Text(text))) = socket.recv().await {
///                 if socket.send(Message::Text(text)).await.is_err() {
///                     return;
///                 }
///             }
///         })
///     })
/// }
/// ```
pub async fn serve(
    mut socket: WebSocket,
    mut goodbye: Goodbye,
    app: impl AsyncFnOnce(&mut WebSocket),
) {
    let close = {
        let app = app(&mut socket);
        tokio::select! {
            () = app => return,
            close = goodbye.closing() => close,
        }
    };
    let frame = CloseFrame {
        code: close.code,
        reason: close.reason.into(),
    };
    if socket.send(Message::Close(Some(frame))).await.is_err() {
        return;
    }
    let answered = async {
        while let Some(Ok(message)) = socket.recv().await {
            if matches!(message, Message::Close(_)) {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(CLOSE_WAIT, answered).await;
}
