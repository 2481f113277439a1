//! Talking to the Hub over HTTP (ureq): a repo's listing, a file's metadata, and a file's bytes
//! into `blobs/<etag>.incomplete`, resumed with a `Range` request after a failure and checked
//! against its ETag (the sha256, or the git blob id) before it is kept.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use sha1::Sha1;
use sha2::{Digest, Sha256};
use ureq::http::Response;
use ureq::Body;

use super::cache_layout::{checked_etag, io};
use super::options::{DownloadProgress, HubOptions};
use crate::{Error, Result};

/// Redirects followed per request (the Hub sends LFS files' bytes from a CDN).
const MAX_REDIRECTS: usize = 10;
/// How often the progress callback hears of a running transfer.
const REPORT_EVERY: u64 = 1 << 20;

/// A failed request: worth trying again (the network, a 5xx or 429 answer), or not.
pub(super) enum Failure {
    Transient(String),
    Final(Error),
}

impl Failure {
    pub fn into_error(self, what: &str) -> Error {
        match self {
            Failure::Final(e) => e,
            Failure::Transient(why) => Error::NotFound(format!("{what}: {why}")),
        }
    }
}

/// What the Hub says of one file before it is fetched.
pub(super) struct FileMeta {
    pub etag: String,
    pub size: Option<u64>,
}

pub(super) struct Client<'a> {
    agent: ureq::Agent,
    options: &'a HubOptions,
    /// `scheme://host[:port]` of the Hub: the token goes there and nowhere else.
    origin: String,
}

impl<'a> Client<'a> {
    pub fn new(options: &'a HubOptions) -> Self {
        let agent = ureq::Agent::config_builder()
            .max_redirects(0)
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .user_agent(format!("nuvec/{}", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client { agent, origin: origin(&options.endpoint).to_string(), options }
    }

    /// The Hub's address.
    pub fn endpoint(&self) -> &str {
        &self.options.endpoint
    }

    /// One request, following redirects (the token kept only while on the Hub's own address).
    /// Returns the first answer when it was a redirect (the Hub's own, which carries an LFS
    /// file's `X-Linked-*` headers), and the final answer.
    fn send(
        &self,
        head: bool,
        url: &str,
        from: u64,
    ) -> std::result::Result<(Option<Response<Body>>, Response<Body>), Failure> {
        let mut url = url.to_string();
        let mut first: Option<Response<Body>> = None;
        for _ in 0..=MAX_REDIRECTS {
            let mut request = match head {
                true => self.agent.head(&url),
                false => self.agent.get(&url),
            };
            if from > 0 {
                request = request.header("Range", &format!("bytes={from}-"));
            }
            if let (Some(token), true) = (&self.options.token, origin(&url) == self.origin) {
                request = request.header("Authorization", &format!("Bearer {token}"));
            }
            let response = request.call().map_err(|e| Failure::Transient(format!("{url}: {e}")))?;
            let status = response.status().as_u16();
            if (300..400).contains(&status) {
                let Some(location) = header(&response, "location") else {
                    return Err(Failure::Final(Error::NotFound(format!(
                        "{url}: a redirect ({status}) without a Location"
                    ))));
                };
                let next = join(&url, &location);
                first.get_or_insert(response);
                url = next;
                continue;
            }
            if status == 429 || status >= 500 {
                return Err(Failure::Transient(format!("{url}: the server answered {status}")));
            }
            if status >= 400 {
                return Err(Failure::Final(self.refusal(&url, status, header(&response, "x-error-code"))));
            }
            return Ok((first, response));
        }
        Err(Failure::Final(Error::NotFound(format!("{url}: more than {MAX_REDIRECTS} redirects"))))
    }

    /// Why the Hub refused `url`, and what to do.
    fn refusal(&self, url: &str, status: u16, code: Option<String>) -> Error {
        let token = match &self.options.token {
            Some(_) => "the token given (HF_TOKEN or the token file) was sent",
            None => "no token was sent: set HF_TOKEN, or log in with `hf auth login`",
        };
        Error::NotFound(match (status, code.as_deref()) {
            (401, _) => format!(
                "{url}: the Hub answered 401 (unauthorized): the repo does not exist, or it is private or gated; {token}"
            ),
            (403, _) => format!(
                "{url}: the Hub answered 403 (forbidden): the token has no access to this repo (a gated repo wants \
                 its terms accepted on its page); {token}"
            ),
            (404, Some("RevisionNotFound")) => {
                format!("{url}: no revision {:?} in this repo (404); check --revision", self.options.revision)
            }
            (404, Some("EntryNotFound")) => format!("{url}: the repo has no such file (404)"),
            (404, _) => format!("{url}: not found (404): check the repo id"),
            _ => format!("{url}: the Hub answered {status}"),
        })
    }

    /// A JSON answer (a repo's listing).
    pub fn json(&self, url: &str) -> std::result::Result<serde_json::Value, Failure> {
        let (_, mut response) = self.send(false, url, 0)?;
        let text = response.body_mut().read_to_string().map_err(|e| Failure::Transient(format!("{url}: {e}")))?;
        serde_json::from_str(&text)
            .map_err(|e| Failure::Final(Error::NotFound(format!("{url}: not the Hub's JSON ({e})"))))
    }

    /// A file's ETag and size, from the first answer (the Hub's, with `X-Linked-*` for an LFS
    /// file it redirects) or the last.
    pub fn meta(&self, url: &str) -> std::result::Result<FileMeta, Failure> {
        let (first, last) = self.send(true, url, 0)?;
        let etag = ["x-linked-etag", "etag"]
            .iter()
            .find_map(|h| first.as_ref().and_then(|f| header(f, h)).or_else(|| header(&last, h)))
            .ok_or_else(|| {
                Failure::Final(Error::NotFound(format!("{url}: the answer has no ETag; is this the Hub?")))
            })?;
        let size = first
            .as_ref()
            .and_then(|f| header(f, "x-linked-size"))
            .or_else(|| header(&last, "x-linked-size"))
            .or_else(|| header(&last, "content-length"))
            .and_then(|s| s.parse().ok());
        Ok(FileMeta { etag: checked_etag(&etag).map_err(Failure::Final)?, size })
    }

    /// Fetches `url` into `part`, resuming from what it holds, trying again after transient
    /// failures; `name` and `size` for the progress reports.
    pub fn fetch(&self, url: &str, part: &Path, name: &str, size: Option<u64>) -> Result<()> {
        let mut tries = 0;
        loop {
            match self.fetch_once(url, part, name, size) {
                Ok(()) => return Ok(()),
                Err(Failure::Transient(_)) if tries < self.options.retries => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(250 << tries.min(5)));
                }
                Err(Failure::Transient(why)) => {
                    return Err(Error::NotFound(format!(
                        "{name}: the download failed after {} tries ({why}); what arrived is kept in {} and \
                         the next run resumes it",
                        tries + 1,
                        part.display()
                    )))
                }
                Err(Failure::Final(e)) => return Err(e),
            }
        }
    }

    fn fetch_once(&self, url: &str, part: &Path, name: &str, size: Option<u64>) -> std::result::Result<(), Failure> {
        let fail = |source| Failure::Final(io(part, source));
        let mut have = part.metadata().map(|m| m.len()).unwrap_or(0);
        if size.is_some_and(|s| have > s) {
            have = 0;
        }
        if have > 0 && size == Some(have) {
            // Whole already (a run that stopped before checking it): the check decides.
            return Ok(());
        }
        let (_, response) = self.send(false, url, have)?;
        let resumed = have > 0 && response.status().as_u16() == 206;
        let mut file = match resumed {
            true => OpenOptions::new().append(true).open(part).map_err(fail)?,
            // A whole answer (the server ignored the range, or nothing was kept): start over.
            false => File::create(part).map_err(fail)?,
        };
        let mut done = if resumed { have } else { 0 };
        let total = size.unwrap_or(0);
        let report = |done: u64| {
            if let Some(DownloadProgress(f)) = &self.options.progress {
                f(name, done, total.max(done));
            }
        };
        report(done);
        let mut reader = response.into_body().into_reader();
        let mut buf = vec![0u8; 256 << 10];
        let mut reported = done;
        loop {
            let n = reader.read(&mut buf).map_err(|e| Failure::Transient(format!("{url}: {e}")))?;
            if n == 0 {
                break;
            }
            file.write_all(&buf[..n]).map_err(fail)?;
            done += n as u64;
            if done - reported >= REPORT_EVERY {
                report(done);
                reported = done;
            }
        }
        file.sync_all().map_err(fail)?;
        if size.is_some_and(|s| done < s) {
            return Err(Failure::Transient(format!("{url}: the answer ended at byte {done} of {total}")));
        }
        Ok(())
    }
}

/// Checks `part`'s bytes against `etag` (and `size` when known); a mismatch removes the file and
/// says so: a corrupted download is never kept.
pub(super) fn verify(part: &Path, etag: &str, size: Option<u64>, name: &str) -> Result<()> {
    let len = part.metadata().map_err(|source| io(part, source))?.len();
    let digest = if etag.len() == 64 {
        hash_file::<Sha256>(part, None)?
    } else {
        hash_file::<Sha1>(part, Some(format!("blob {len}\0")))?
    };
    let size_ok = size.is_none_or(|s| s == len);
    if digest == etag && size_ok {
        return Ok(());
    }
    let _ = std::fs::remove_file(part);
    let kind = if etag.len() == 64 { "sha256" } else { "git blob id" };
    Err(Error::NotFound(format!(
        "{name}: the downloaded file is corrupt ({len} bytes, {kind} {digest}; the Hub says {} bytes, {etag}); \
         it was not kept: run again to download it anew",
        size.map_or("?".to_string(), |s| s.to_string())
    )))
}

fn hash_file<D: Digest>(path: &Path, prefix: Option<String>) -> Result<String> {
    let mut hasher = D::new();
    if let Some(p) = prefix {
        hasher.update(p.as_bytes());
    }
    let mut file = File::open(path).map_err(|source| io(path, source))?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|source| io(path, source))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn header(response: &Response<Body>, name: &str) -> Option<String> {
    response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// `scheme://host[:port]` of `url`.
fn origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    match url[after_scheme..].find('/') {
        Some(i) => &url[..after_scheme + i],
        None => url,
    }
}

/// A redirect's `location` made absolute against `url`.
fn join(url: &str, location: &str) -> String {
    if location.starts_with("http://") || location.starts_with("https://") {
        location.to_string()
    } else if location.starts_with('/') {
        format!("{}{location}", origin(url))
    } else {
        let base = url.split('?').next().unwrap_or(url);
        format!("{}/{location}", &base[..base.rfind('/').unwrap_or(base.len())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_resolve_against_the_request() {
        assert_eq!(origin("http://127.0.0.1:8/a/b?c"), "http://127.0.0.1:8");
        assert_eq!(join("http://h:1/a/b", "/cdn/x"), "http://h:1/cdn/x");
        assert_eq!(join("http://h:1/a/b", "https://cdn/y"), "https://cdn/y");
        assert_eq!(join("http://h:1/a/b?q", "c"), "http://h:1/a/c");
    }
}
