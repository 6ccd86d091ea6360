//! What every request to the admin API passes before a handler sees it,
//! in this order, each refusal before anything else of the request is
//! read:
//!
//! 1. its `Host` must be the address the API is bound to, `localhost`, or
//!    a name the operator allowed (`AdminOptions::with_allowed_host`):
//!    else 421, so that a page whose name an attacker pointed at this
//!    machine (DNS rebinding) cannot read or drive the API;
//! 2. anything but the probes and the dashboard's own files needs the
//!    bearer token, when the API has one (401);
//! 3. a request that changes something (any method but `GET`, `HEAD` and
//!    `OPTIONS`) made without a token must come from the API's own pages
//!    or from a program, never from another site's page: it needs
//!    `Content-Type: application/json` (which a page on another origin
//!    cannot send without a preflight this API never grants) and an
//!    `Origin`, if any, that is this server's (403);
//! 4. a body of at most [`BODY_LIMIT`] bytes (413), arriving within
//!    [`BODY_TIMEOUT`] (408).
//!
//! Error answers of an API without a token carry no absolute paths (see
//! [`redact_paths`]).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;

use super::ApiError;

/// The most bytes of a request's body: the API's bodies are a name or two.
pub(super) const BODY_LIMIT: usize = 4 * 1024;

/// How long a request's body may take to arrive once its head has.
pub(super) const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// The most bytes of an error answer that is searched for paths to
/// redact; longer ones (none of the API's) are cut.
const ERROR_LIMIT: usize = 64 * 1024;

/// A token's SHA-256: what the API keeps and compares, never the token.
pub(super) type Digest = [u8; 32];

pub(super) fn digest(token: &str) -> Digest {
    use sha2::Digest as _;
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// Whether two digests are equal, in time that does not depend on where
/// they differ.
fn same(a: &Digest, b: &Digest) -> bool {
    std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

/// Checks the bearer token of a request against `want` (no token: all
/// may).
pub(super) fn authorize(want: Option<&Digest>, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(want) = want else { return Ok(()) };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| digest(token.trim()));
    match given {
        Some(given) if same(&given, want) => Ok(()),
        _ => Err(ApiError(StatusCode::UNAUTHORIZED, "a valid bearer token is required".into())),
    }
}

/// Which paths need no token: a job's or a group's.
#[derive(Clone, Copy, Debug)]
pub(super) enum Layout {
    /// One job's API: its probes and pages at the root.
    Job,
    /// A group's: its own probes and pages, and each job's under
    /// `/jobs/<job>/`.
    Group,
}

impl Layout {
    /// Whether `path` is a probe or one of the dashboard's files (which
    /// hold no data): open without the token.
    fn is_open(self, path: &str) -> bool {
        // Exact paths only: nothing with `..`, an encoding or a suffix the
        // router might read otherwise.
        let page = |p: &str| {
            matches!(
                p,
                "/" | "/dashboard"
                    | "/healthz"
                    | "/readyz"
                    | "/dashboard/app.js"
                    | "/dashboard/style.css"
                    | "/dashboard/group.js"
            )
        };
        match self {
            Self::Job => page(path),
            Self::Group => {
                if let Some(after) = path.strip_prefix("/jobs/") {
                    // `/jobs/<job>` (a redirect to `/jobs/<job>/`) and
                    // the job's own open paths under it.
                    return after.find('/').is_none_or(|at| after.get(at..).is_some_and(page));
                }
                page(path)
            }
        }
    }
}

/// Whom an admin API answers, and how.
#[derive(Debug)]
pub(super) struct Gate {
    /// The token's digest, if the API has one.
    pub(super) token: Option<Digest>,
    /// The address the API is bound to.
    pub(super) bound: SocketAddr,
    /// Names, lowercase, that `Host` may carry besides the bound address
    /// and `localhost`.
    pub(super) hosts: Vec<String>,
    pub(super) layout: Layout,
}

impl Gate {
    /// Lets `request` through with its body read, or answers it.
    pub(super) async fn admit<B>(&self, request: Request<B>) -> Result<Request<Body>, Response>
    where
        B: http_body::Body<Data = axum::body::Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (parts, body) = request.into_parts();
        let host = parts.headers.get(header::HOST).map(|h| h.to_str().map(str::to_string));
        let host = match host {
            None => None,
            Some(Ok(h)) => Some(h),
            Some(Err(_)) => return Err(refuse(StatusCode::BAD_REQUEST, "the `Host` header is not text".into())),
        };
        if let Some(host) = &host
            && !self.host_allowed(host)
        {
            return Err(refuse(
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "this admin API does not answer for host `{}`: only for its address, `localhost` and the \
                     names given to `AdminOptions::with_allowed_host`",
                    host.chars().take(256).collect::<String>()
                ),
            ));
        }
        let path = parts.uri.path();
        let open = self.layout.is_open(path);
        if !open && let Err(e) = authorize(self.token.as_ref(), &parts.headers) {
            return Err(e.into_response());
        }
        let changes = !matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
        if !changes || open {
            // Nothing to read: the body (if any) is dropped unread, and
            // the connection closed after the answer.
            return Ok(Request::from_parts(parts, Body::empty()));
        }
        if self.token.is_none()
            && let Err(why) = same_origin(&parts.headers, host.as_deref(), &self.hosts)
        {
            return Err(refuse(StatusCode::FORBIDDEN, why));
        }
        let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > BODY_LIMIT as u64) {
            return Err(too_large());
        }
        let limited = http_body_util::Limited::new(body, BODY_LIMIT);
        let bytes = match tokio::time::timeout(BODY_TIMEOUT, limited.collect()).await {
            Err(_) => {
                return Err(refuse(
                    StatusCode::REQUEST_TIMEOUT,
                    format!("the request's body did not arrive within {} s", BODY_TIMEOUT.as_secs()),
                ));
            }
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
            Ok(Err(e)) => return Err(refuse(StatusCode::BAD_REQUEST, format!("the request's body: {e}"))),
            Ok(Ok(collected)) => collected.to_bytes(),
        };
        Ok(Request::from_parts(parts, Body::from(bytes)))
    }

    /// Whether `Host: host` names this server.
    fn host_allowed(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        if name == "localhost" {
            return true;
        }
        let literal = match name.strip_prefix('[') {
            Some(v6) => v6.strip_suffix(']'),
            None => Some(name.as_str()),
        };
        if let Some(ip) = literal.and_then(|l| l.parse::<IpAddr>().ok()) {
            let bound = self.bound.ip();
            return ip == bound || bound.is_unspecified() || (ip.is_loopback() && bound.is_loopback());
        }
        self.hosts.contains(&name)
    }

    /// `response`, with the absolute paths of an error answer redacted
    /// when the API has no token (with one, only those who gave it get
    /// this far).
    pub(super) async fn finish(&self, response: Response) -> Response {
        if self.token.is_some() || !(response.status().is_client_error() || response.status().is_server_error()) {
            return response;
        }
        let (mut parts, body) = response.into_parts();
        let text = match http_body_util::Limited::new(body, ERROR_LIMIT).collect().await {
            Ok(collected) => String::from_utf8_lossy(&collected.to_bytes()).into_owned(),
            Err(_) => String::from("{\"error\": \"an error answer too long to show\"}"),
        };
        let text = redact_paths(&text);
        parts.headers.remove(header::CONTENT_LENGTH);
        if let Ok(len) = HeaderValue::from_str(&text.len().to_string()) {
            parts.headers.insert(header::CONTENT_LENGTH, len);
        }
        Response::from_parts(parts, Body::from(text))
    }
}

/// The name part of a `Host` header (`name`, `name:port`, `[v6]:port`).
pub(super) fn host_name(host: &str) -> &str {
    let host = host.trim();
    if host.starts_with('[') {
        return host.find(']').and_then(|end| host.get(..=end)).unwrap_or(host);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Why a state-changing request made without a token could come from
/// another site's page, if it could: its content type is not JSON, its
/// `Sec-Fetch-Site` says another site, or its `Origin` is not this
/// server (`host`, as the request names it) nor one of the allowed
/// `names`.
fn same_origin(headers: &HeaderMap, host: Option<&str>, names: &[String]) -> Result<(), String> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim())
        .is_some_and(|v| v.eq_ignore_ascii_case("application/json"));
    if !json {
        return Err("a request that changes something needs `Content-Type: application/json` (or the token)".into());
    }
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()).unwrap_or("none");
    if !matches!(site, "same-origin" | "none") {
        return Err(format!("a request from another site's page (`Sec-Fetch-Site: {site}`) changes nothing here"));
    }
    let Some(origin) = headers.get(header::ORIGIN) else { return Ok(()) };
    let origin = origin.to_str().unwrap_or_default();
    let authority = origin.split_once("://").map_or("", |(_, a)| a.trim_end_matches('/'));
    let ours = host.is_some_and(|h| !authority.is_empty() && authority.eq_ignore_ascii_case(h.trim()))
        || names.iter().any(|n| host_name(authority).eq_ignore_ascii_case(n));
    if ours {
        Ok(())
    } else {
        Err(format!(
            "a request from a page of `{}` changes nothing here: only this server's own pages may, or a client \
             with the token",
            origin.chars().take(256).collect::<String>()
        ))
    }
}

fn refuse(status: StatusCode, message: String) -> Response {
    ApiError(status, message).into_response()
}

fn too_large() -> Response {
    refuse(StatusCode::PAYLOAD_TOO_LARGE, format!("the request's body is over {BODY_LIMIT} bytes"))
}

/// `text` with every absolute path shortened to `…/<its last part>`: a
/// path starts with `/` after a space, a quote, a backtick, `(`, `=` or
/// the start, and runs to the next of those (or `,`, `)`); the API's own
/// endpoints (`/api/…`, `/jobs/…`, ...) are left alone.
pub(super) fn redact_paths(text: &str) -> String {
    const ENDS: &[char] = &[' ', '"', '\'', '`', ')', ',', '\n', '\t'];
    const OURS: &[&str] = &["/api/", "/jobs/", "/dashboard", "/healthz", "/readyz", "/metrics"];
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut previous: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        let starts = c == '/' && previous.is_none_or(|p| " \"'`(=\n\t".contains(p));
        if starts {
            let end = rest.find(ENDS).unwrap_or(rest.len());
            let (path, after) = rest.split_at(end);
            let components = path.split('/').filter(|s| !s.is_empty()).count();
            if components >= 2 && !OURS.iter().any(|o| path.starts_with(o)) {
                let last = path.trim_end_matches('/').rsplit('/').next().unwrap_or_default();
                out.push('…');
                out.push('/');
                out.push_str(last);
            } else {
                out.push_str(path);
            }
            previous = path.chars().last();
            rest = after;
            continue;
        }
        out.push(c);
        previous = Some(c);
        rest = rest.get(c.len_utf8()..).unwrap_or_default();
    }
    out
}

/// What a field of a request's body must be.
#[derive(Clone, Copy, Debug)]
pub(super) enum Field {
    /// A string, required.
    Text,
    /// A string or `null`, or absent.
    MaybeText,
}

/// A request's JSON body, which must be an object with only the `fields`
/// given, each of its kind (an empty body is an empty object where no
/// field is required): the fields' string values, in `fields`' order.
/// Anything else is a 400 that names the field or the position.
pub(super) fn object<const N: usize>(
    bytes: &[u8],
    fields: &[(&str, Field); N],
) -> Result<[Option<String>; N], ApiError> {
    let bad = |message: String| ApiError(StatusCode::BAD_REQUEST, message);
    let expected = || {
        let names: Vec<String> = fields.iter().map(|(n, _)| format!("`{n}`")).collect();
        if names.is_empty() { "no fields".to_string() } else { names.join(", ") }
    };
    let pairs = if bytes.iter().all(u8::is_ascii_whitespace) {
        Vec::new()
    } else {
        let Pairs(pairs) = serde_json::from_slice::<Pairs>(bytes)
            .map_err(|e| bad(format!("the request's body must be a JSON object with {}: {e}", expected())))?;
        pairs
    };
    let mut values: [Option<String>; N] = std::array::from_fn(|_| None);
    let mut seen = [false; N];
    for (name, value) in pairs {
        let Some(at) = fields.iter().position(|(n, _)| *n == name) else {
            return Err(bad(format!("unknown field `{name}` in the request's body: it takes {}", expected())));
        };
        if seen.get(at).copied().unwrap_or(false) {
            return Err(bad(format!("field `{name}` is given twice in the request's body")));
        }
        if let Some(s) = seen.get_mut(at) {
            *s = true;
        }
        let kind = fields.get(at).map(|(_, k)| *k);
        let value = match (value, kind) {
            (serde_json::Value::String(s), _) => Some(s),
            (serde_json::Value::Null, Some(Field::MaybeText)) => None,
            (other, _) => {
                return Err(bad(format!("field `{name}` must be a string, not {}", kind_of(&other))));
            }
        };
        if let Some(v) = values.get_mut(at) {
            *v = value;
        }
    }
    for ((name, kind), seen) in fields.iter().zip(&seen) {
        if matches!(kind, Field::Text) && !seen {
            return Err(bad(format!("field `{name}` is missing from the request's body")));
        }
    }
    Ok(values)
}

fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A JSON object's members in order, duplicates kept (an array or any
/// other value is an error).
struct Pairs(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Pairs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Pairs;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Pairs, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<String, serde_json::Value>()? {
                    if pairs.len() >= 16 {
                        return Err(serde::de::Error::custom("more than 16 fields"));
                    }
                    pairs.push(pair);
                }
                Ok(Pairs(pairs))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use proptest::prelude::*;

    use super::*;

    fn gate(bound: &str, hosts: &[&str]) -> Gate {
        Gate {
            token: None,
            bound: bound.parse().unwrap(),
            hosts: hosts.iter().map(|h| (*h).to_string()).collect(),
            layout: Layout::Job,
        }
    }

    #[test]
    fn hosts_the_server_answers_for() {
        let local = gate("127.0.0.1:9000", &["jobs.example.com"]);
        for ok in ["127.0.0.1:9000", "127.0.0.1", "localhost:9000", "LOCALHOST", "[::1]:9000", "jobs.example.com:443"] {
            assert!(local.host_allowed(ok), "{ok}");
        }
        for refused in ["attacker.example:9000", "10.0.0.1:9000", "localhost.attacker.example", "", "[::1"] {
            assert!(!local.host_allowed(refused), "{refused}");
        }
        let any = gate("0.0.0.0:9000", &[]);
        assert!(any.host_allowed("10.1.2.3:9000") && any.host_allowed("[fe80::1]:9000"));
        assert!(!any.host_allowed("pod.cluster.local:9000"));
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn only_json_from_this_origin_or_no_page_changes_anything() {
        let json = ("content-type", "application/json; charset=utf-8");
        let host = Some("127.0.0.1:9000");
        assert!(same_origin(&headers(&[json]), host, &[]).is_ok());
        assert!(same_origin(&headers(&[json, ("origin", "http://127.0.0.1:9000")]), host, &[]).is_ok());
        let proxied = ["jobs.example.com".to_string()];
        assert!(same_origin(&headers(&[json, ("origin", "https://jobs.example.com")]), host, &proxied).is_ok());
        for refused in [
            headers(&[]),
            headers(&[("content-type", "text/plain")]),
            headers(&[json, ("origin", "http://attacker.example")]),
            headers(&[json, ("origin", "http://127.0.0.1:3000")]),
            headers(&[json, ("origin", "null")]),
            headers(&[json, ("sec-fetch-site", "cross-site")]),
            headers(&[json, ("sec-fetch-site", "same-site")]),
        ] {
            assert!(same_origin(&refused, host, &[]).is_err(), "{refused:?}");
        }
        assert!(same_origin(&headers(&[json, ("origin", "http://127.0.0.1:9000")]), None, &[]).is_err());
    }

    #[test]
    fn open_paths() {
        for open in ["/", "/dashboard", "/dashboard/app.js", "/healthz", "/readyz"] {
            assert!(Layout::Job.is_open(open) && Layout::Group.is_open(open), "{open}");
        }
        for open in ["/jobs/a", "/jobs/a/", "/jobs/a/healthz", "/jobs/a/dashboard/style.css"] {
            assert!(Layout::Group.is_open(open), "{open}");
        }
        for closed in [
            "/api/job",
            "/metrics",
            "/jobs/a/api/stop",
            "/jobs/a/metrics",
            "/nowhere",
            "/healthz/x",
            "/dashboard/../api/job",
            "/jobs/a/dashboard/../api/stop",
            "/jobs/a/dashboard/%2e%2e/api/stop",
        ] {
            assert!(!Layout::Job.is_open(closed) && !Layout::Group.is_open(closed), "{closed}");
        }
    }

    #[test]
    fn paths_are_redacted_but_endpoints_kept() {
        let text = r#"{"error": "checkpoint 3: cannot write `/home/ops/ckpt/savepoints/x/MANIFEST`: see /api/checkpoints (/var/lib/a,b)"}"#;
        assert_eq!(
            redact_paths(text),
            r#"{"error": "checkpoint 3: cannot write `…/MANIFEST`: see /api/checkpoints (…/a,b)"}"#
        );
        assert_eq!(redact_paths("http://host/a/b and a/b/c"), "http://host/a/b and a/b/c");
        assert_eq!(redact_paths("at=/tmp/x/y"), "at=…/y");
    }

    #[test]
    fn bodies_are_objects_of_known_fields() {
        let name = [("name", Field::Text)];
        assert_eq!(object(br#"{"name": "x"}"#, &name).unwrap(), [Some("x".to_string())]);
        fn refusal<const N: usize>(body: &[u8], fields: &[(&str, Field); N]) -> String {
            object(body, fields).unwrap_err().1
        }
        assert!(refusal(br#"["x"]"#, &name).contains("JSON object"), "{}", refusal(br#"["x"]"#, &name));
        assert!(refusal(br#"{"name": "x", "more": 1}"#, &name).contains("unknown field `more`"));
        assert!(refusal(br#"{"name": ["x"]}"#, &name).contains("field `name` must be a string, not an array"));
        assert!(refusal(br#"{"name": "x", "name": "y"}"#, &name).contains("twice"));
        assert!(refusal(b"", &name).contains("field `name` is missing"));
        assert!(refusal(b"{\"name\": ", &name).contains("line 1 column"));
        let stop = [("savepoint", Field::MaybeText)];
        assert_eq!(object(b" ", &stop).unwrap(), [None]);
        assert_eq!(object(br#"{"savepoint": null}"#, &stop).unwrap(), [None]);
        assert!(refusal(b"[]", &stop).contains("JSON object"));
    }

    proptest! {
        #[test]
        fn any_body_is_a_value_or_a_400(body in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Err(e) = object(&body, &[("name", Field::Text), ("savepoint", Field::MaybeText)]) {
                prop_assert_eq!(e.0, StatusCode::BAD_REQUEST);
            }
        }

        #[test]
        fn redaction_keeps_text_without_paths(text in "[a-z :`\"(=,]{0,60}") {
            prop_assert_eq!(redact_paths(&text), text);
        }

        #[test]
        fn no_absolute_path_survives_redaction(dirs in proptest::collection::vec("[a-z0-9._-]{1,8}", 2..6), before in "[a-z ]{0,10}") {
            prop_assume!(!["api", "jobs", "metrics"].contains(&dirs[0].as_str()) && !dirs[0].starts_with("dashboard"));
            let path = format!("/{}", dirs.join("/"));
            let redacted = redact_paths(&format!("{before} {path} more"));
            prop_assert!(!redacted.contains(&path), "{}", redacted);
        }
    }
}
