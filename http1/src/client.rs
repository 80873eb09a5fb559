//! Reaching a worker, and one-shot HTTP/1.1 requests to it: the registration and heartbeat
//! probes, `_pinned/stats` and `_wake` calls (and a worker's calls to its registry). A fresh
//! connection per call, one request, the whole (capped) answer, all within one deadline. The
//! forwarding data plane keeps pooled connections instead; these calls are rare.
//!
//! Every connection to a worker is made by [`WorkerAddr::connect`]: TCP, then a TLS handshake
//! when the advertise URL is `https`, verified by the caller's [`ClientTls`].

use std::net::IpAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, StatusCode, header};
use monoio::io::AsyncWriteRentExt;
use monoio_codec::{Decoded, Decoder};

use super::chunked::{ChunkedDecoder, Piece};
use super::conn::read_into;
use super::head::{HeadError, ResponseHeadDecoder};
use crate::error::{Error, Origin};
use crate::head_writer::{HeadWriter, Unwritable};
use crate::tls::ClientTls;
use crate::transport::Transport;

const MAX_HEAD: usize = 64 * 1024;

/// Where a worker is reached, parsed from its advertise URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerAddr {
    pub tls: bool,
    /// Lowercased; IPv6 literals without brackets.
    pub host: String,
    pub port: u16,
    /// The URL's own path without its trailing slash (`""` for none): it prefixes every path
    /// sent to the worker.
    pub base: String,
    /// `host` as an IP literal, when it is one: connected to without any name lookup.
    pub ip: Option<IpAddr>,
}

impl WorkerAddr {
    /// Parses an advertise URL by the spec's field rules: an HTTP(S) URL with a host and no
    /// userinfo; trailing slashes stripped. The error names the rule broken.
    pub fn parse(url: &str) -> Result<WorkerAddr, &'static str> {
        let uri: http::Uri = url
            .parse()
            .map_err(|_| "advertiseUrl must be an http or https URL")?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err("advertiseUrl must be an http or https URL"),
        };
        let authority = uri.authority().ok_or("advertiseUrl must name a host")?;
        if authority.as_str().contains('@') {
            return Err("advertiseUrl must not carry userinfo");
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err("advertiseUrl must name a host");
        }
        if uri.query().is_some() || url.contains('#') {
            return Err("advertiseUrl must not carry a query or fragment");
        }
        let port = match authority.port_u16() {
            Some(0) => return Err("advertiseUrl port must be 1-65535"),
            Some(p) => p,
            None if authority.as_str().ends_with(':') => {
                return Err("advertiseUrl port must be 1-65535");
            }
            None if tls => 443,
            None => 80,
        };
        Ok(WorkerAddr {
            tls,
            ip: host.parse().ok(),
            host: host.to_ascii_lowercase(),
            port,
            base: uri.path().trim_end_matches('/').to_string(),
        })
    }

    /// A connection to the worker: TCP (a host name resolved off the event loop, Nagle off),
    /// then, for an `https` URL, the TLS handshake, with SNI and the certificate verified by
    /// `tls` (against the host name, or an IP literal's address). A failed handshake is an
    /// error whose message starts `TLS handshake: ` and carries rustls' reason (an unknown
    /// issuer, a name the certificate is not valid for).
    pub async fn connect(&self, tls: &ClientTls) -> std::io::Result<Transport> {
        let tcp = super::resolve::connect(&self.host, self.ip, self.port).await?;
        let _ = tcp.set_nodelay(true);
        if !self.tls {
            return Ok(Transport::Plain(tcp));
        }
        tls.connect(tcp, &self.host)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("TLS handshake: {e}")))
    }

    /// `host:port` as a Host header writes it (IPv6 literals in brackets).
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Sends one request to `target` at `path` (which must start with `/`) and reads the answer,
/// all within `deadline`; an `https` target is verified by `tls`. The body is capped at
/// `max_body` bytes. An error is retryable when the request never reached the worker (the
/// connection or its TLS handshake could not be made): sending it again cannot act twice. A
/// timeout is not: the worker may have the request.
#[allow(clippy::too_many_arguments)]
pub async fn fetch(
    target: &WorkerAddr,
    tls: &ClientTls,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    deadline: Duration,
    max_body: usize,
) -> Result<Answer, Error> {
    match monoio::time::timeout(
        deadline,
        exchange(target, tls, method, path, headers, body, max_body),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(Error::new(Origin::Upstream, "timed out")),
    }
}

/// The request head of a one-shot call: the caller's `headers` after `host`, `content-length` and
/// `connection: close`, each checked by [`HeadWriter`].
fn write_head(
    out: &mut BytesMut,
    target: &WorkerAddr,
    method: &Method,
    path: &str,
    headers: &[(&str, &str)],
    body_len: usize,
) -> Result<(), Unwritable> {
    let mut head = HeadWriter::request(out, method, &target.base, path)?;
    head.header("host", target.authority().as_bytes())?;
    head.field_display(&http::header::CONTENT_LENGTH, body_len)?;
    head.header("connection", b"close")?;
    for (name, value) in headers {
        head.header(name, value.as_bytes())?;
    }
    head.finish()
}

async fn exchange(
    target: &WorkerAddr,
    tls: &ClientTls,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    max_body: usize,
) -> Result<Answer, Error> {
    let upstream = |context: &'static str| move |e| Error::because(Origin::Upstream, context, e);
    // Written before connecting: a head that cannot be written is never sent, nor half sent.
    let mut out = BytesMut::with_capacity(256 + body.len());
    write_head(&mut out, target, &method, path, headers, body.len())
        .map_err(|e| Error::because(Origin::Upstream, "writing the request head", e))?;
    out.extend_from_slice(body);
    let mut stream = target
        .connect(tls)
        .await
        .map_err(|e| upstream("connecting")(e).retryable(true))?;
    let (written, _) = stream.write_all(out).await;
    written.map_err(upstream("sending the request"))?;

    let mut buf = BytesMut::with_capacity(4096);
    let mut decoder = ResponseHeadDecoder::new(MAX_HEAD);
    let head = loop {
        match decoder.decode(&mut buf) {
            Ok(Decoded::Some(head)) => break head,
            Ok(_) => {}
            Err(HeadError::TooLarge(_)) => {
                return Err(Error::new(Origin::Upstream, "response head too large"));
            }
            Err(e) => {
                return Err(Error::because(
                    Origin::Upstream,
                    "malformed response head",
                    e,
                ));
            }
        }
        if read_into(&mut stream, &mut buf)
            .await
            .map_err(upstream("reading"))?
            == 0
        {
            return Err(Error::new(Origin::Upstream, "closed before answering"));
        }
    };

    let too_large = || Error::new(Origin::Upstream, "response body too large");
    let chunked = head
        .headers
        .get(header::TRANSFER_ENCODING)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"chunked"));
    let length = head
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let no_body = method == Method::HEAD
        || head.status.is_informational()
        || head.status == StatusCode::NO_CONTENT
        || head.status == StatusCode::NOT_MODIFIED;
    let body = if no_body {
        Bytes::new()
    } else if chunked {
        let mut decoder = ChunkedDecoder::default();
        let mut body = BytesMut::new();
        loop {
            match decoder.decode(&mut buf) {
                Err(e) => {
                    return Err(Error::because(
                        Origin::Upstream,
                        "malformed chunked body",
                        e,
                    ));
                }
                Ok(Some(Piece::End)) => break body.freeze(),
                Ok(Some(Piece::Data(d))) => {
                    if body.len() + d.len() > max_body {
                        return Err(too_large());
                    }
                    body.extend_from_slice(&d);
                    continue;
                }
                Ok(None) => {}
            }
            if read_into(&mut stream, &mut buf)
                .await
                .map_err(upstream("reading"))?
                == 0
            {
                return Err(Error::new(Origin::Upstream, "closed mid-body"));
            }
        }
    } else {
        if length.is_some_and(|l| l > max_body) {
            return Err(too_large());
        }
        loop {
            if length.is_some_and(|l| buf.len() >= l) {
                break buf.split_to(length.unwrap_or_default()).freeze();
            }
            if buf.len() > max_body {
                return Err(too_large());
            }
            if read_into(&mut stream, &mut buf)
                .await
                .map_err(upstream("reading"))?
                == 0
            {
                if length.is_some() {
                    return Err(Error::new(Origin::Upstream, "closed mid-body"));
                }
                break buf.split().freeze();
            }
        }
    };
    Ok(Answer {
        status: head.status,
        headers: head.headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// M1 of issue 23: whatever a caller hands in (a registration's `secret`), a one-shot call
    /// is one request head or none at all.
    #[test]
    fn a_value_with_a_line_end_is_never_written() {
        let worker = WorkerAddr::parse("http://127.0.0.1:9/base").unwrap();
        let secret = "AAAAAAAAAAAAAAAA\r\nX-Injected: yes\r\n\r\nPOST /internal/admin/delete-everything HTTP/1.1\r\n";
        let mut out = BytesMut::new();
        let written = write_head(
            &mut out,
            &worker,
            &Method::GET,
            "/_pinned/challenge?challenge=c",
            &[("pinboard-proxy-secret", secret)],
            0,
        );
        assert_eq!(written, Err(Unwritable("header value")));
        let mut out = BytesMut::new();
        write_head(&mut out, &worker, &Method::POST, "/_wake", &[("x", "1")], 2).unwrap();
        assert_eq!(
            &out[..],
            b"POST /base/_wake HTTP/1.1\r\nhost: 127.0.0.1:9\r\ncontent-length: 2\r\n\
              connection: close\r\nx: 1\r\n\r\n"
        );
    }

    #[test]
    fn advertise_url_rules() {
        let a = WorkerAddr::parse("http://Worker-1.local:8081/base//").unwrap();
        assert_eq!(
            (a.host.as_str(), a.port, a.base.as_str()),
            ("worker-1.local", 8081, "/base")
        );
        assert_eq!(a.authority(), "worker-1.local:8081");
        let v6 = WorkerAddr::parse("https://[::1]/").unwrap();
        assert_eq!(
            (v6.tls, v6.host.as_str(), v6.port, v6.authority().as_str()),
            (true, "::1", 443, "[::1]:443")
        );
        for (bad, rule) in [
            ("ftp://h:1", "advertiseUrl must be an http or https URL"),
            ("not a url", "advertiseUrl must be an http or https URL"),
            ("/relative", "advertiseUrl must be an http or https URL"),
            ("http://user:pw@h:1", "advertiseUrl must not carry userinfo"),
            (
                "http://h:1/?q=1",
                "advertiseUrl must not carry a query or fragment",
            ),
            ("http://h:0", "advertiseUrl port must be 1-65535"),
        ] {
            assert_eq!(WorkerAddr::parse(bad), Err(rule), "{bad}");
        }
    }
}
