//! The operator console (`console = true`): the static files of `console/` — plain HTML, CSS
//! and ES modules, no build step — embedded in the binary at build time and served at
//! `/_console/` (outside `base_path`, like `/metrics`) on the main listener and the metrics
//! listener. The page signs in with an operator credential and calls only the operator
//! routes, so what it shows and does is exactly what that credential may (`console/README.md`).
//!
//! Every file is answered with headers that keep a pasted credential in the page: a strict
//! `Content-Security-Policy` (own scripts, styles and connections only, no inline script, no
//! framing), `X-Content-Type-Options: nosniff`, `X-Frame-Options: DENY`,
//! `Referrer-Policy: no-referrer` and `Cache-Control: no-cache` (a new binary's files are
//! fetched anew). `index.html` learns the node's `base_path` from a `<meta>` filled in here.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode, header};

use crate::answers;
use crate::http::{Request, Response};

/// Where the console is mounted, on the request's path as sent.
pub const MOUNT: &str = "/_console";

/// One embedded file: its name under [`MOUNT`], its type and its bytes.
struct File {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! file {
    ($name:literal, $type:expr) => {
        File {
            name: $name,
            content_type: $type,
            body: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/console/", $name)),
        }
    };
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every file the console serves (a test checks this is every page file of `console/`).
const FILES: &[File] = &[
    file!("index.html", HTML),
    file!("style.css", CSS),
    file!("app.js", JS),
    file!("api.js", JS),
    file!("dom.js", JS),
    file!("fleet.js", JS),
    file!("instances.js", JS),
    file!("actions.js", JS),
    file!("charts.js", JS),
    file!("prom.js", JS),
    file!("plot.js", JS),
];

/// The `<meta>` of `index.html` the node fills in with its `base_path`.
const BASE_PATH_META: &str = r#"<meta name="pinboard-base-path" content="">"#;

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// Whether `path` (as sent) is the console's: `/_console` itself or below `/_console/`. One
/// comparison for any other path: the data plane pays nothing more.
pub fn is_console_path(path: &str) -> bool {
    path.strip_prefix(MOUNT)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The answer to a request for a console path ([`is_console_path`]): a file, the redirect of
/// `/_console` to `/_console/`, 404 for a name that is no file, 405 for a method other than
/// GET and HEAD.
pub fn serve(req: &Request<'_>, base_path: &str) -> Response {
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return answers::method_not_allowed("GET, HEAD");
    }
    let rest = &req.path()[MOUNT.len()..];
    if rest.is_empty() {
        let to = HeaderValue::from_static("/_console/");
        return guarded(Response::empty(StatusCode::MOVED_PERMANENTLY))
            .header(header::LOCATION, to);
    }
    let name = match &rest[1..] {
        "" => "index.html",
        name => name,
    };
    let Some(file) = FILES.iter().find(|f| f.name == name) else {
        return answers::not_found();
    };
    let body = if file.name == "index.html" {
        Bytes::from(with_base_path(file.body, base_path))
    } else {
        Bytes::from_static(file.body)
    };
    guarded(Response::new(StatusCode::OK, Some(file.content_type), body))
}

/// `index.html` with the `<meta>` naming `base_path`, escaped for an attribute.
fn with_base_path(index: &[u8], base_path: &str) -> String {
    let text = std::str::from_utf8(index).expect("index.html is UTF-8");
    let mut escaped = String::with_capacity(base_path.len());
    for c in base_path.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '"' => escaped.push_str("&quot;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            c => escaped.push(c),
        }
    }
    let filled = format!(r#"<meta name="pinboard-base-path" content="{escaped}">"#);
    text.replacen(BASE_PATH_META, &filled, 1)
}

/// The headers every console answer carries.
fn guarded(response: Response) -> Response {
    const HEADERS: [(&str, &str); 5] = [
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-cache"),
    ];
    HEADERS.into_iter().fold(response, |r, (name, value)| {
        r.header(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_paths_are_whole_segments() {
        for path in [
            "/_console",
            "/_console/",
            "/_console/app.js",
            "/_console/x/y",
        ] {
            assert!(is_console_path(path), "{path}");
        }
        for path in ["/_consoles", "/_console.js", "/threads/_console", "/", ""] {
            assert!(!is_console_path(path), "{path}");
        }
    }

    /// Every page file of `console/` is embedded, and nothing else is.
    #[test]
    fn every_file_of_the_console_folder_is_served() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/console");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".html") || n.ends_with(".js") || n.ends_with(".css"))
            .collect();
        on_disk.sort();
        let mut served: Vec<String> = FILES.iter().map(|f| f.name.to_owned()).collect();
        served.sort();
        assert_eq!(on_disk, served);
        for file in FILES {
            let expected = match file.name.rsplit('.').next() {
                Some("html") => HTML,
                Some("js") => JS,
                _ => CSS,
            };
            assert_eq!(file.content_type, expected, "{}", file.name);
        }
    }

    #[test]
    fn the_index_names_the_base_path_escaped() {
        let index = FILES[0].body;
        assert!(std::str::from_utf8(index).unwrap().contains(BASE_PATH_META));
        let filled = with_base_path(index, "/a\"<b>&");
        assert!(
            filled.contains(r#"content="/a&quot;&lt;b&gt;&amp;""#),
            "{filled}"
        );
        assert!(!filled.contains(BASE_PATH_META));
    }
}
