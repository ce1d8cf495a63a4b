//! Flame graphs drawn by inferno and embedded in the report's page, each in
//! its own frame, and HTML escaping (used by every part of the page).

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
    fn inferno_renders_a_searchable_svg() {
        let mut h = String::new();
        let lines = vec!["main;work;slow_part 9".to_string(), "main;idle 1".into()];
        embed(&mut h, "t", &lines, &mut options("t".into()), "moment");
        assert!(h.contains("srcdoc="), "{h}");
        assert!(h.contains("slow_part"));
        assert!(h.contains("function search("));
    }
}
