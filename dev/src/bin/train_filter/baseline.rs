//! The baseline the model is compared with: a regex blocklist of the kind a WAF starter kit ships
//! (in the spirit of the OWASP Core Rule Set's simplest rules), matched case-insensitively on the
//! raw request line and on its URL-decoded form (one round of `%XX` and `+` decoding, as a WAF's
//! `urlDecode` transformation does). It was written knowing the four attack families, so it is an
//! optimistic baseline, not a strawman.

use regex::{Regex, RegexSet};

/// The rules, by family.
const RULES: &[(&str, &str)] = &[
    // Path traversal and local file inclusion.
    ("path_traversal", r"\.\.[/\\;]"),
    (
        "path_traversal",
        r"%2e%2e|\.\.%2f|\.\.%5c|%252e|%c0%ae|%uff0e",
    ),
    (
        "path_traversal",
        r"/etc/(passwd|shadow|hosts|group|issue)|win\.ini|boot\.ini|/proc/self/",
    ),
    ("path_traversal", r"(file|php|zip|expect)://"),
    // SQL injection.
    ("sql_injection", r"\bunion\b.{0,20}\bselect\b"),
    ("sql_injection", r"'\s*(or|and|having|group|order)\b"),
    ("sql_injection", r"\b(or|and)\s+\d+\s*=\s*\d+"),
    (
        "sql_injection",
        r"\b(sleep|benchmark|pg_sleep|extractvalue|updatexml)\s*\(",
    ),
    (
        "sql_injection",
        r"waitfor\s+delay|xp_cmdshell|information_schema|@@version",
    ),
    (
        "sql_injection",
        r"'\s*(--|#|;)|;\s*(drop|select|delete|insert|update)\b",
    ),
    ("sql_injection", r"\border\s+by\s+\d+\s*(--|#)"),
    // Command injection.
    (
        "command_injection",
        r"(;|\||&&|`|\$\()\s*(id|whoami|uname|cat|ls|wget|curl|nc|bash|sh|ping|sleep|rm|chmod|python|perl|busybox|echo|powershell|cmd|net|tftp|cd)\b",
    ),
    (
        "command_injection",
        r"\$\{ifs\}|\$ifs|/bin/(ba)?sh|/dev/tcp/",
    ),
    // Scanner probes.
    (
        "scanner_probe",
        r"/\.(env|git|svn|hg|aws|ssh|htaccess|htpasswd|ds_store|vscode|bash_history)\b",
    ),
    (
        "scanner_probe",
        r"/(wp-admin|wp-login\.php|xmlrpc\.php|wp-content/plugins|wp-includes)",
    ),
    ("scanner_probe", r"/(phpmyadmin|pma|myadmin|mysqladmin)/"),
    (
        "scanner_probe",
        r"/(actuator|cgi-bin|hnap1|boaform|manager/html|jmx-console|server-status|_ignition|telescope|gponform|solr/admin)\b",
    ),
    (
        "scanner_probe",
        r"/vendor/phpunit/|eval-stdin\.php|phpinfo\.php|/shell\.php",
    ),
    ("scanner_probe", r"/[\w-]*\.(sql|bak)\b"),
];

/// The compiled rule set, and the SQL comment pattern of the normalisation.
pub struct Baseline {
    rules: RegexSet,
    comment: Regex,
}

impl Baseline {
    /// Compiles the rules.
    pub fn new() -> Result<Baseline, regex::Error> {
        let patterns = RULES.iter().map(|(_, re)| format!("(?i){re}"));
        let comment = Regex::new(r"/\*.*?\*/")?;
        Ok(Baseline {
            rules: RegexSet::new(patterns)?,
            comment,
        })
    }

    /// Whether `line` is blocked: some rule matches it raw or URL-decoded.
    pub fn blocks(&self, line: &str) -> bool {
        self.rules.is_match(line) || self.rules.is_match(&self.normalise(line))
    }

    /// The line as the rules also see it: one round of URL decoding (`%XX` to the byte, `+` to a
    /// space; invalid UTF-8 replaced), then SQL comments `/*...*/` replaced by a space (the Core Rule
    /// Set's `urlDecodeUni` and `replaceComments` transformations).
    fn normalise(&self, s: &str) -> String {
        let (b, mut out, mut i) = (s.as_bytes(), Vec::with_capacity(s.len()), 0);
        let hex = |c: u8| (c as char).to_digit(16);
        while i < b.len() {
            let pair = b.get(i + 1..i + 3).map(|p| (hex(p[0]), hex(p[1])));
            match (b[i], pair) {
                (b'%', Some((Some(h), Some(l)))) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                (b'+', _) => out.push(b' '),
                (c, _) => out.push(c),
            }
            i += 1;
        }
        let decoded = String::from_utf8_lossy(&out).into_owned();
        self.comment.replace_all(&decoded, " ").into_owned()
    }
}
