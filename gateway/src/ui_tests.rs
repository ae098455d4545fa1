//! The asset table against the files on disk and against every reference the page and
//! the scripts make, and the headers each answer carries.

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::*;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ui")
}

fn text(name: &str) -> &'static str {
    std::str::from_utf8(ASSETS[find(name).unwrap()].body).unwrap()
}

/// What follows each occurrence of `start` up to the next `end`.
fn between<'a>(s: &'a str, start: &str, end: char) -> Vec<&'a str> {
    s.split(start).skip(1).filter_map(|rest| rest.split(end).next()).collect()
}

#[test]
fn the_table_holds_exactly_the_files_in_the_ui_directory() {
    let on_disk: BTreeSet<String> =
        std::fs::read_dir(dir()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    let table: BTreeSet<String> = ASSETS.iter().map(|a| a.name.to_owned()).collect();
    assert_eq!(on_disk, table);
}

#[test]
fn every_file_the_page_and_the_scripts_refer_to_is_served() {
    let page = text("index.html");
    let mut refs: Vec<&str> = between(page, "\"/ui/", '"');
    assert!(refs.contains(&"app.js") && refs.contains(&"base.css"), "{refs:?}");
    for a in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
        let js = text(a.name);
        refs.extend(between(js, "from './", '\''));
        refs.extend(between(js, "import('./", '\''));
    }
    for r in refs {
        assert!(find(r).is_some(), "{r} is referred to but not in the table");
    }
}

#[test]
fn no_ui_file_is_over_500_lines_and_none_loads_anything_from_elsewhere() {
    for a in ASSETS {
        let t = std::str::from_utf8(a.body).unwrap();
        assert!(t.lines().count() <= 500, "{} has {} lines", a.name, t.lines().count());
        assert!(!t.contains("//cdn") && !t.contains("https://fonts"), "{} loads from a CDN", a.name);
    }
    // The page loads its scripts as modules from this origin, never inline.
    assert!(!text("index.html").contains("<script>"), "inline script");
}

fn header(r: &Response<Body>, name: header::HeaderName) -> &str {
    r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

#[test]
fn the_page_and_files_come_with_their_type_a_strict_policy_and_an_etag() {
    let r = page(&HeaderMap::new());
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, header::CONTENT_TYPE), "text/html; charset=utf-8");
    assert!(header(&r, header::CONTENT_SECURITY_POLICY).contains("script-src 'self'"));
    assert_eq!(header(&r, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
    let tag = header(&r, header::ETAG).to_owned();
    assert!(tag.starts_with('"') && tag.len() == 18, "{tag}");
    let Body::Full(Some(b)) = r.into_body() else { panic!("a whole body") };
    assert!(b.starts_with(b"<!doctype html>"));

    let js = asset("/ui/app.js", &HeaderMap::new());
    assert_eq!(header(&js, header::CONTENT_TYPE), "text/javascript; charset=utf-8");
    assert_ne!(header(&js, header::ETAG), tag, "each file has its own tag");

    let mut h = HeaderMap::new();
    h.insert(header::IF_NONE_MATCH, HeaderValue::from_str(&tag).unwrap());
    let again = page(&h);
    assert_eq!(again.status(), 304);
    assert!(matches!(again.into_body(), Body::Full(None)));
}

#[test]
fn an_unknown_file_is_404_in_the_api_shape() {
    let r = asset("/ui/nope.js", &HeaderMap::new());
    assert_eq!(r.status(), 404);
    let Body::Full(Some(b)) = r.into_body() else { panic!("a whole body") };
    assert!(b.starts_with(br#"{"error":"#), "{b:?}");
}
