//! The HTTP request lines the filter model learns from and is tested on, generated from grammars:
//! `METHOD TARGET HTTP/1.x` (no CRLF, at most [`LINE_MAX`] bytes, so the filter's first
//! `bytes` of the payload hold the whole line). Half are benign traffic of ordinary sites, half
//! attacks of four families.
//!
//! Held out honestly: every list of values below (words, parameters, paths, payload templates,
//! commands, probe paths) is split, every fourth value (index % 4 == 3) being *held out*: the
//! training generator never draws those, the test generator draws from every value. So most test
//! lines contain something training never saw, and the test measures generalisation.

use std::collections::HashSet;

use qwen_bpf_dev::rng::Rng;

use super::lists::*;

/// The longest line, in bytes: the rule's `bytes`.
pub const LINE_MAX: usize = 256;

/// What a line is: benign, or the attack family it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Benign,
    Traversal,
    Sqli,
    Cmdi,
    Scanner,
}

impl Family {
    /// Every family, benign first.
    pub const ALL: [Family; 5] = [
        Family::Benign,
        Family::Traversal,
        Family::Sqli,
        Family::Cmdi,
        Family::Scanner,
    ];

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::Benign => "benign",
            Family::Traversal => "path_traversal",
            Family::Sqli => "sql_injection",
            Family::Cmdi => "command_injection",
            Family::Scanner => "scanner_probe",
        }
    }

    /// Whether lines of this family are attacks (the positive class).
    pub fn malicious(self) -> bool {
        self != Family::Benign
    }
}

/// One request line and its family.
#[derive(Clone, Debug)]
pub struct Example {
    pub family: Family,
    pub line: String,
}

/// The training set (`train` lines) and a test set (`test` lines) none of whose lines is in it.
pub fn datasets(
    seed: u64,
    train: usize,
    test: usize,
) -> Result<(Vec<Example>, Vec<Example>), String> {
    let mut seen = HashSet::new();
    let mut g = Gen::new(seed, false);
    let train = g.unique(train, &mut seen)?;
    let mut g = Gen::new(seed ^ 0x7E57, true);
    let test = g.unique(test, &mut seen)?;
    Ok((train, test))
}

/// A grammar generator: the training one, or the test one (which also draws held-out values).
struct Gen {
    rng: Rng,
    test: bool,
}

impl Gen {
    fn new(seed: u64, test: bool) -> Gen {
        Gen {
            rng: Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1),
            test,
        }
    }

    /// `n` examples whose lines are not in `seen` (which receives them).
    fn unique(&mut self, n: usize, seen: &mut HashSet<String>) -> Result<Vec<Example>, String> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n * 50 {
            let e = self.example();
            if seen.insert(e.line.clone()) {
                out.push(e);
                if out.len() == n {
                    return Ok(out);
                }
            }
        }
        Err(format!(
            "only {} distinct lines of {n} after {} draws",
            out.len(),
            n * 50
        ))
    }

    /// One example: benign with probability 1/2, else an attack of a uniformly chosen family.
    fn example(&mut self) -> Example {
        loop {
            let family = match self.below(8) {
                0 => Family::Traversal,
                1 => Family::Sqli,
                2 => Family::Cmdi,
                3 => Family::Scanner,
                _ => Family::Benign,
            };
            let (method, target) = match family {
                Family::Benign => self.benign(),
                Family::Traversal => self.traversal(),
                Family::Sqli => self.sqli(),
                Family::Cmdi => self.cmdi(),
                Family::Scanner => self.scanner(),
            };
            let version = if self.chance(0.9) { "1.1" } else { "1.0" };
            let line = format!("{method} {target} HTTP/{version}");
            if line.len() <= LINE_MAX {
                return Example { family, line };
            }
        }
    }

    // ---- Random choices ----

    fn below(&mut self, n: usize) -> usize {
        (self.rng.next() % n as u64) as usize
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.unit() < p
    }

    fn num(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.rng.next() % (hi - lo + 1)
    }

    /// Any value of `xs` (lists too short or too generic to hold values out of).
    fn any<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }

    /// A value of `xs`: the training generator skips the held-out ones (index % 4 == 3).
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        loop {
            let i = self.below(xs.len());
            if self.test || i % 4 != 3 {
                return xs[i];
            }
        }
    }

    /// `n` random characters of `alphabet`.
    fn chars(&mut self, n: usize, alphabet: &str) -> String {
        let a = alphabet.as_bytes();
        (0..n).map(|_| a[self.below(a.len())] as char).collect()
    }

    fn hex(&mut self, n: usize) -> String {
        self.chars(n, "0123456789abcdef")
    }

    fn alnum(&mut self, n: usize) -> String {
        self.chars(
            n,
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-",
        )
    }

    fn uuid(&mut self) -> String {
        let (a, b, c, d, e) = (
            self.hex(8),
            self.hex(4),
            self.hex(4),
            self.hex(4),
            self.hex(12),
        );
        format!("{a}-{b}-{c}-{d}-{e}")
    }

    /// `n` words of WORDS, a few of them non-ASCII (mostly percent-encoded, as browsers send them).
    fn words(&mut self, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                if self.chance(0.08) {
                    let w = self.pick(UNICODE_WORDS);
                    if self.chance(0.8) {
                        pct_encode(w, |_| false)
                    } else {
                        w.to_string()
                    }
                } else {
                    self.pick(WORDS).to_string()
                }
            })
            .collect()
    }

    /// A search phrase of `lo..=hi` words as a form field: words joined by `+` or `%20`, apostrophes as `%27`.
    fn phrase(&mut self, lo: u64, hi: u64) -> String {
        let n = self.num(lo, hi) as usize;
        let sep = if self.chance(0.7) { "+" } else { "%20" };
        let mut ws = self.words(n);
        if self.chance(0.1) {
            let i = self.below(ws.len());
            ws[i] = format!("{}%27s", ws[i]); // "men's"
        }
        ws.join(sep)
    }

    /// `lo..=hi` words joined by `-`.
    fn slug(&mut self, lo: u64, hi: u64) -> String {
        let n = self.num(lo, hi) as usize;
        self.words(n).join("-")
    }

    /// `lo..=hi` query parameters of a page (`?a=1&b=2`): pagination, sorting, filters, tracking.
    fn params(&mut self, lo: u64, hi: u64) -> String {
        let n = self.num(lo, hi) as usize;
        let mut out = String::new();
        for _ in 0..n {
            let kv = match self.below(6) {
                0 => format!("page={}", self.num(1, 40)),
                1 => format!("{}={}", self.pick(PARAMS), self.pick(WORDS)),
                2 => format!("{}={}", self.pick(PARAMS), self.num(0, 500)),
                3 => self.tracking(),
                4 => format!(
                    "sort={}&order={}",
                    self.pick(WORDS),
                    self.any(&["asc", "desc"])
                ),
                _ => format!("{}={}", self.pick(PARAMS), self.phrase(1, 1)),
            };
            out.push(if out.is_empty() { '?' } else { '&' });
            out.push_str(&kv);
        }
        out
    }

    fn tracking(&mut self) -> String {
        match self.below(5) {
            0 => format!(
                "utm_source={}&utm_medium={}&utm_campaign={}",
                self.pick(UTM_SOURCES),
                self.pick(UTM_MEDIA),
                self.slug(2, 2).replace('-', "_")
            ),
            1 => format!("fbclid=IwAR{}", self.alnum(40)),
            2 => format!("gclid=Cj0KCQ{}", self.alnum(36)),
            3 => format!("ref={}", self.pick(WORDS)),
            _ => {
                let (a, b) = (self.num(100_000_000, 999_999_999), self.num(1, 999_999_999));
                format!("_ga=2.{a}.{b}.{}", self.num(1_600_000_000, 1_800_000_000))
            }
        }
    }

    // ---- Benign ----

    fn benign(&mut self) -> (&'static str, String) {
        match self.below(10) {
            0 | 1 => {
                let m = if self.chance(0.1) { "HEAD" } else { "GET" };
                (m, self.asset())
            }
            2 | 3 => ("GET", self.page()),
            4 | 5 => self.api(),
            6 => (
                "GET",
                format!(
                    "/search?q={}{}",
                    self.phrase(1, 5),
                    self.params(0, 2).replacen('?', "&", 1)
                ),
            ),
            7 => ("GET", format!("/{}{}", self.page_path(), self.params(1, 3))),
            8 => self.form(),
            _ => ("GET", self.any(MISC).to_string()),
        }
    }

    /// A static file: /dir/name[-hash][.min].ext[?v=...].
    fn asset(&mut self) -> String {
        let dir = self.pick(ASSET_DIRS);
        let mut name = self.pick(ASSET_NAMES).to_string();
        if self.chance(0.4) {
            name = format!("{name}.{}", self.hex(8));
        } else if self.chance(0.3) {
            name = format!("{name}-{}", self.slug(1, 1));
        }
        let ext = self.pick(EXTENSIONS);
        let min = if matches!(ext, "js" | "css") && self.chance(0.4) {
            ".min"
        } else {
            ""
        };
        let v = if self.chance(0.2) {
            format!("?v={}", self.num(1, 999))
        } else {
            String::new()
        };
        if dir == "uploads" {
            return format!(
                "/uploads/{}/{:02}/{name}.{ext}",
                self.num(2015, 2025),
                self.num(1, 12)
            );
        }
        format!("/{dir}/{name}{min}.{ext}{v}")
    }

    /// An HTML page path (no leading slash).
    fn page_path(&mut self) -> String {
        let section = self.pick(SECTIONS);
        match self.below(5) {
            0 => format!(
                "{section}/{}/{:02}/{}",
                self.num(2012, 2025),
                self.num(1, 12),
                self.slug(2, 6)
            ),
            1 => format!("{section}/{}-{}", self.slug(1, 4), self.num(10, 99999)),
            2 => format!("{section}/{}.html", self.slug(1, 3)),
            3 => format!("{section}/{}/", self.slug(1, 3)),
            _ => format!(
                "{}/{section}/{}",
                self.any(&["en", "de", "fr", "en-us", "es"]),
                self.slug(2, 2)
            ),
        }
    }

    fn page(&mut self) -> String {
        let p = self.page_path();
        if self.chance(0.3) {
            format!("/{p}?{}", self.tracking())
        } else {
            format!("/{p}")
        }
    }

    /// A REST call: /api/vN/resource[/id[/sub]] with the method that fits.
    fn api(&mut self) -> (&'static str, String) {
        let base = format!("/api/v{}/{}", self.num(1, 3), self.pick(RESOURCES));
        let id = match self.below(3) {
            0 => self.num(1, 999_999).to_string(),
            1 => self.uuid(),
            _ => self.slug(2, 2),
        };
        match self.below(8) {
            0 | 1 => ("GET", format!("{base}{}", self.params(1, 3))),
            2 | 3 => ("GET", format!("{base}/{id}/{}", self.pick(SUBRESOURCES))),
            4 => ("POST", base),
            5 => (self.any(&["PUT", "PATCH"]), format!("{base}/{id}")),
            6 => ("DELETE", format!("{base}/{id}")),
            _ => ("OPTIONS", format!("{base}/{id}")),
        }
    }

    fn form(&mut self) -> (&'static str, String) {
        let path = self.any(FORMS);
        if self.chance(0.3) {
            (
                "POST",
                format!("{path}?redirect=%2F{}", self.pick(SECTIONS)),
            )
        } else {
            ("POST", path.to_string())
        }
    }

    // ---- Attacks ----

    /// A benign-looking (path, parameter) to carry an attack, from `carriers`.
    fn carrier(&mut self, carriers: &[&'static str]) -> (String, String) {
        let c = self.pick(carriers);
        let (path, param) = c.split_once('?').unwrap_or((c, "id"));
        let path = if self.chance(0.2) {
            format!("/{}{path}", self.pick(SECTIONS))
        } else {
            path.to_string()
        };
        (path, param.to_string())
    }

    fn traversal(&mut self) -> (&'static str, String) {
        let step = self.pick(TRAVERSAL_STEPS);
        let mut file = self.pick(TRAVERSAL_FILES).to_string();
        if step.contains("%2f") && self.chance(0.5) {
            file = file.replace('/', "%2f");
        } else if step.contains('\\') || step.contains("%5c") {
            file = file.replace('/', if step.contains('\\') { "\\" } else { "%5c" });
        }
        let dots = step.repeat(self.num(1, 9) as usize);
        let tail = if self.chance(0.15) {
            self.any(&["%00", "%00.png", "%00.html", "%00.jpg"])
        } else {
            ""
        };
        let (path, param) = self.carrier(TRAVERSAL_CARRIERS);
        let target = match self.below(6) {
            0 => format!("{path}/{dots}{file}{tail}"),
            1 => format!(
                "/{}?{param}={}",
                path.trim_start_matches('/'),
                self.pick(ABSOLUTE_FILES)
            ),
            2 => format!(
                "{path}?{param}={}/{dots}{file}{tail}",
                self.pick(ASSET_DIRS)
            ),
            _ => format!("{path}?{param}={dots}{file}{tail}"),
        };
        (self.any(&["GET", "GET", "GET", "POST", "HEAD"]), target)
    }

    fn sqli(&mut self) -> (&'static str, String) {
        let mut p = self.pick(SQLI).to_string();
        p = p.replace("{n}", &self.num(1, 20).to_string());
        p = p.replace("{t}", self.pick(TABLES));
        // Keyword case: as written, lower, or random per letter.
        p = match self.below(4) {
            0 => p.to_lowercase(),
            1 => p
                .chars()
                .map(|c| {
                    if self.chance(0.5) {
                        c.to_ascii_uppercase()
                    } else {
                        c.to_ascii_lowercase()
                    }
                })
                .collect(),
            _ => p,
        };
        // URL syntax: '#' must be encoded; quotes, parentheses, '=' and ',' are or are not.
        let encode_all = self.chance(0.15);
        let (quote, eq) = (self.chance(0.5), self.chance(0.3));
        let space = self.any(&["+", "+", "%20", "%20", "/**/", "%09", "%0a"]);
        let p = pct_encode(&p, |c| match c {
            ' ' => false,
            '\'' | '"' => !quote,
            '=' => !eq,
            '#' | '%' | '&' | '<' | '>' => false,
            _ => !encode_all,
        })
        .replace("%20", space);
        let value = match self.below(3) {
            0 => self.num(1, 9999).to_string(),
            1 => self.pick(WORDS).to_string(),
            _ => String::new(),
        };
        let (path, param) = self.carrier(SQLI_CARRIERS);
        let target = match self.below(5) {
            0 => format!(
                "/api/v{}/{}/{}{p}",
                self.num(1, 3),
                self.pick(RESOURCES),
                self.num(1, 999)
            ),
            1 => format!(
                "{path}?{}&{param}={value}{p}",
                self.params(1, 1).trim_start_matches('?')
            ),
            _ => format!("{path}?{param}={value}{p}"),
        };
        (self.any(&["GET", "GET", "GET", "POST"]), target)
    }

    fn cmdi(&mut self) -> (&'static str, String) {
        let cmd = self.pick(COMMANDS);
        let cmd = cmd
            .replace(
                "{ip}",
                &format!(
                    "{}.{}.{}.{}",
                    self.num(1, 223),
                    self.num(0, 255),
                    self.num(0, 255),
                    self.num(1, 254)
                ),
            )
            .replace("{port}", &self.num(1024, 65535).to_string())
            .replace(
                "{f}",
                self.pick(&["x", "bins", "mozi.m", "a.sh", "t", "update", "k"]),
            )
            .replace("{n}", &self.num(2, 30).to_string());
        let space = self.any(&["+", "+", "%20", "%20", "${IFS}", "%09", "$IFS$9"]);
        let slash_raw = self.chance(0.7);
        let cmd = pct_encode(&cmd, |c| match c {
            ' ' | '&' | '#' | '%' => false,
            '/' => slash_raw,
            _ => true,
        })
        .replace("%20", space);
        let sep = self.pick(SEPARATORS);
        let injected = match sep.split_once("CMD") {
            Some((a, b)) => format!("{a}{cmd}{b}"),
            None => format!("{sep}{cmd}"),
        };
        let value = self.pick(CMD_VALUES);
        let (path, param) = self.carrier(CMD_CARRIERS);
        let target = if self.chance(0.2) {
            format!(
                "{path}?{}&{param}={value}{injected}",
                self.params(1, 1).trim_start_matches('?')
            )
        } else {
            format!("{path}?{param}={value}{injected}")
        };
        (self.any(&["GET", "GET", "POST"]), target)
    }

    fn scanner(&mut self) -> (&'static str, String) {
        let mut probe = self.pick(PROBES).to_string();
        if self.chance(0.3) && !probe.contains('?') {
            probe = format!("/{}{probe}", self.pick(PROBE_DIRS));
        }
        if self.chance(0.1) {
            probe = probe.to_uppercase();
        }
        if self.chance(0.15) && !probe.contains('?') {
            probe = format!(
                "{probe}?{}",
                self.any(&["", "x=1", "debug=1", "format=json", "v=1"])
            );
        }
        (self.any(&["GET", "GET", "GET", "HEAD", "POST"]), probe)
    }
}

/// `s` with every byte outside `keep` (plus the unreserved ASCII letters, digits, `-._~`) as
/// `%XX` (upper-case hex, as browsers write it).
fn pct_encode(s: &str, keep: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || "-._~".contains(c) || (c.is_ascii() && keep(c)) {
            out.push(c);
        } else {
            let mut b = [0u8; 4];
            for byte in c.encode_utf8(&mut b).bytes() {
                out.push_str(&format!("%{byte:02X}"));
            }
        }
    }
    out
}
