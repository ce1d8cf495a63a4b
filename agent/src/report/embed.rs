//! Flame graphs drawn by inferno and embedded in the report's page, each in
//! its own frame; the compressed parts of the page, built when their hit's
//! section opens; and HTML escaping (used by every part of the page).

use std::fmt::Write as _;

use inferno::flamegraph::{self, Options};

/// inferno's script records zoom and search in the URL
/// (`history.replaceState`), which a `srcdoc` frame of a `file://` page may
/// not do (a SecurityError): there the state simply stays unrecorded.
const KEEP_URL: &str = "(function(){var r=history.replaceState.bind(history);\
history.replaceState=function(){try{r.apply(null,arguments)}catch(e){}};})();";

pub fn options(title: String) -> Options<'static> {
    let mut o = Options::default();
    o.title = title;
    o.count_name = "samples".into();
    o.hash = true;
    o
}

/// Renders folded lines with inferno and embeds the SVG in an iframe.
pub fn embed(h: &mut String, title: &str, lines: &[String], opt: &mut Options<'_>, class: &str) {
    let _ = write!(h, "<h4>{}</h4>", esc(title));
    if lines.is_empty() {
        h.push_str("<p class=\"note\">No samples.</p>");
        return;
    }
    let mut svg = Vec::new();
    if let Err(e) = flamegraph::from_lines(opt, lines.iter().map(String::as_str), &mut svg) {
        let _ = write!(
            h,
            "<p class=\"bad\">No flame graph: {}</p>",
            esc(&e.to_string())
        );
        return;
    }
    let svg = String::from_utf8_lossy(&svg);
    let svg = &svg[svg.find("<svg").unwrap_or(0)..];
    let height = svg_height(svg).unwrap_or(400) + 8;
    let doc = format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><style>svg{{width:100%;min-width:320px}}</style>\
         <script>{KEEP_URL}</script></head>\
         <body style=\"margin:0\">{svg}</body></html>"
    );
    let _ = write!(
        h,
        "<iframe class=\"fg {class}\" title=\"{}\" style=\"height:{height}px\" srcdoc=\"{}\"></iframe>",
        esc(title),
        attr(&doc)
    );
}

/// The parts of the page built when their hit's section opens
/// (`lazy.js`): each gzip-compressed and base64-encoded in a script element
/// the browser does not run. inferno's SVGs shrink about tenfold; the page
/// parses a few bytes per hit until it is opened (docs/report.md).
///
/// inferno writes the same 17.8 KB script into every SVG drawn with the
/// same options; each part's graphs would carry their own copy (about
/// 5 KB of its 7 KB compressed). Each distinct script is kept once, after
/// the parts ([`Lazy::finish`]), and a part holds a marker in its place.
#[derive(Default)]
pub struct Lazy {
    scripts: Vec<String>,
}

/// How inferno's script begins and ends inside a `srcdoc` attribute
/// ([`attr`] escaped its quotes).
const FG_SCRIPT: (&str, &str) = (
    "<script type=&quot;text/ecmascript&quot;><![CDATA[",
    "]]></script>",
);

impl Lazy {
    /// Writes `html` as a part built when its section opens.
    pub fn part(&mut self, h: &mut String, html: &str) {
        compressed(h, "gz", &self.hoist(html));
    }

    /// Replaces each inferno script in `html` with `<!--mt-fg-script-N-->`,
    /// N its index in `self.scripts`. The marker cannot come from a graph:
    /// inferno escapes `<` in names, and [`attr`] escapes `&` again.
    fn hoist(&mut self, html: &str) -> String {
        let (open, close) = FG_SCRIPT;
        let mut out = String::with_capacity(html.len());
        let mut rest = html;
        while let Some(i) = rest.find(open) {
            let Some(j) = rest[i..].find(close) else {
                break;
            };
            let script = &rest[i..i + j + close.len()];
            let n = match self.scripts.iter().position(|s| s == script) {
                Some(n) => n,
                None => {
                    self.scripts.push(script.to_string());
                    self.scripts.len() - 1
                }
            };
            out.push_str(&rest[..i]);
            let _ = write!(out, "<!--mt-fg-script-{n}-->");
            rest = &rest[i + j + close.len()..];
        }
        out.push_str(rest);
        out
    }

    /// Writes the scripts the parts' markers stand for, in their order,
    /// compressed as the parts are.
    pub fn finish(self, h: &mut String) {
        for s in &self.scripts {
            compressed(h, "fg-js", s);
        }
    }
}

/// `text`, gzip-compressed and base64-encoded, in a script element of
/// class `class` that the browser does not run (`lazy.js` inflates it).
fn compressed(h: &mut String, class: &str, text: &str) {
    let _ = write!(
        h,
        "<script type=\"application/octet-stream\" class=\"{class}\">{}</script>",
        base64(&gzip(text.as_bytes()))
    );
}

fn gzip(b: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all(b).expect("writes to memory");
    z.finish().expect("writes to memory")
}

/// Standard base64 with padding, as `atob` reads it.
fn base64(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// The root element's `height="N"`.
fn svg_height(svg: &str) -> Option<u64> {
    let head = &svg[..svg.find('>')?];
    let i = head.find(" height=\"")? + 9;
    let rest = &head[i..];
    rest[..rest.find('"')?].parse().ok()
}

/// Escapes text for HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Escapes a document for a double-quoted attribute (`srcdoc`).
fn attr(s: &str) -> String {
    s.replace('&', "&amp;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_inferno_script_is_kept_once() {
        let mut lazy = Lazy::default();
        let mut a = String::new();
        let mut inverted = options("c".into());
        inverted.direction = inferno::flamegraph::Direction::Inverted;
        for (title, line, mut opt) in [
            ("a", "main;f 3", options("a".into())),
            ("b", "main;g 5", options("b".into())),
            ("c", "main;g 5", inverted),
        ] {
            embed(&mut a, title, &[line.into()], &mut opt, "x");
        }
        let hoisted = lazy.hoist(&a);
        assert_eq!(lazy.scripts.len(), 2, "one script per set of options");
        assert_eq!(hoisted.matches("<!--mt-fg-script-0-->").count(), 2);
        assert_eq!(hoisted.matches("<!--mt-fg-script-1-->").count(), 1);
        assert!(!hoisted.contains("CDATA"));
        // Putting the scripts back gives the graphs as drawn.
        let mut back = hoisted.clone();
        for (n, s) in lazy.scripts.iter().enumerate() {
            back = back.replace(&format!("<!--mt-fg-script-{n}-->"), s);
        }
        assert_eq!(back, a);
        assert!(
            hoisted.len() * 3 < a.len(),
            "{} of {}",
            hoisted.len(),
            a.len()
        );
    }

    #[test]
    fn svg_height_and_escaping() {
        assert_eq!(
            svg_height(
                "<svg version=\"1.1\" width=\"1200\" height=\"342\" onload=\"init(evt)\"><g height=\"1\">"
            ),
            Some(342)
        );
        assert_eq!(esc("<a&\"b\">"), "&lt;a&amp;&quot;b&quot;&gt;");
        assert_eq!(
            attr("<a href=\"x\">&amp;"),
            "<a href=&quot;x&quot;>&amp;amp;"
        );
    }

    #[test]
    fn a_lazy_part_is_gzip_in_base64() {
        assert_eq!(base64(b"hello"), "aGVsbG8=");
        assert_eq!(base64(b"hi"), "aGk=");
        assert_eq!(base64(b"abc"), "YWJj");
        assert_eq!(base64(b""), "");
        let mut h = String::new();
        let text = "<iframe srcdoc=\"x\"></iframe>".repeat(100);
        Lazy::default().part(&mut h, &text);
        let b64 = h
            .strip_prefix("<script type=\"application/octet-stream\" class=\"gz\">")
            .and_then(|r| r.strip_suffix("</script>"))
            .expect("one script element");
        assert!(b64.len() < text.len() / 4, "{b64}");
        // Decoded and inflated, it is the text.
        let val = |c: u8| A64.iter().position(|&x| x == c).unwrap() as u32;
        let mut bytes = Vec::new();
        for q in b64.as_bytes().chunks(4) {
            let n = q
                .iter()
                .fold(0, |n, &c| n << 6 | if c == b'=' { 0 } else { val(c) });
            let keep = q.iter().filter(|&&c| c != b'=').count() - 1;
            bytes.extend(&n.to_be_bytes()[1..1 + keep]);
        }
        let mut out = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut out)
            .unwrap();
        assert_eq!(out, text);
    }

    const A64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    #[test]
    fn inferno_renders_a_searchable_svg() {
        let mut h = String::new();
        let lines = vec!["main;work;slow_part 9".to_string(), "main;idle 1".into()];
        embed(&mut h, "t", &lines, &mut options("t".into()), "moment");
        assert!(h.contains("srcdoc="), "{h}");
        assert!(h.contains("slow_part"));
        assert!(h.contains("function search("));
    }
}
