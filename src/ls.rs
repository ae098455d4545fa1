//! `corral ls [QUERY] [--json]`: the models `corral serve` would serve, with what their
//! GGUF header says (architecture, quantization, training context), read without
//! loading them.

use std::io::Write;

use anyhow::Result;
use clap::Args;
use corral_pool::gguf_meta::{self, file_type_name};
use corral_pool::registry;

#[derive(Args)]
pub struct LsArgs {
    /// Only the models whose id contains this (case-insensitive).
    query: Option<String>,
    /// Models directory (the Hugging Face cache is searched too).
    #[arg(long, env = "CORRAL_MODELS_DIR")]
    models_dir: Option<std::path::PathBuf>,
    /// One JSON object per model and line, instead of a table.
    #[arg(long)]
    json: bool,
}

struct Row {
    id: String,
    bytes: u64,
    arch: Option<String>,
    quant: Option<String>,
    ctx: Option<u64>,
    repo: Option<String>,
    path: String,
}

pub fn ls(args: LsArgs) -> Result<()> {
    let dir = args.models_dir.clone().unwrap_or_else(registry::default_models_dir);
    let mut known = crate::models::discover(&dir)?;
    if let Some(q) = &args.query {
        known = registry::select(known, |k| &k.entry.id, q)?;
    }
    if known.is_empty() {
        eprintln!(
            "corral: no models in {} or in the Hugging Face cache {} (corral pull ORG/REPO fetches one)",
            dir.display(),
            crate::models::hf_cache_root().display()
        );
        return Ok(());
    }
    let rows: Vec<Row> = known
        .into_iter()
        .map(|k| {
            let meta = gguf_meta::read(&k.entry.path)
                .inspect_err(|e| tracing::warn!(model = %k.entry.id, error = %e, "cannot read the GGUF header"))
                .ok();
            Row {
                id: k.entry.id.to_string(),
                bytes: k.entry.bytes,
                quant: meta
                    .as_ref()
                    .and_then(|m| m.file_type)
                    .map(|t| file_type_name(t).map_or(t.to_string(), str::to_owned)),
                ctx: meta.as_ref().and_then(|m| m.context_length),
                arch: meta.map(|m| m.arch).filter(|a| !a.is_empty()),
                repo: k.repo,
                path: k.entry.path.display().to_string(),
            }
        })
        .collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        for r in &rows {
            let v = serde_json::json!({
                "id": r.id, "bytes": r.bytes, "arch": r.arch, "quantization": r.quant,
                "context_length": r.ctx, "repo": r.repo, "path": r.path,
            });
            writeln!(out, "{v}")?;
        }
    } else {
        table(&mut out, &rows)?;
    }
    Ok(())
}

fn table(out: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    let dash = || "-".to_owned();
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.id.clone(),
                size(r.bytes),
                r.arch.clone().unwrap_or_else(dash),
                r.quant.clone().unwrap_or_else(dash),
                r.ctx.map_or_else(dash, |c| c.to_string()),
                r.repo.clone().map_or("models dir".to_owned(), |r| format!("hf:{r}")),
            ]
        })
        .collect();
    let head = ["ID", "SIZE", "ARCH", "QUANT", "CTX", "FROM"].map(str::to_owned);
    let mut width = head.clone().map(|h| h.len());
    for c in &cells {
        for (w, v) in width.iter_mut().zip(c) {
            *w = (*w).max(v.len());
        }
    }
    for line in std::iter::once(&head).chain(&cells) {
        let mut s = String::new();
        for (i, (v, w)) in line.iter().zip(width).enumerate() {
            if i + 1 == line.len() {
                s.push_str(v);
            } else {
                s.push_str(&format!("{v:<w$}  "));
            }
        }
        writeln!(out, "{s}")?;
    }
    Ok(())
}

/// Decimal units, as file managers and the hub show sizes.
fn size(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..1_000_000 => format!("{:.0} kB", b / 1e3),
        1_000_000..1_000_000_000 => format!("{:.0} MB", b / 1e6),
        _ => format!("{:.1} GB", b / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_columns() {
        assert_eq!(size(98_362_432), "98 MB");
        assert_eq!(size(4_920_000_000), "4.9 GB");
        assert_eq!(size(1_234), "1 kB");
        let rows = [Row {
            id: "m".into(),
            bytes: 253_113_024,
            arch: Some("gemma3".into()),
            quant: Some("Q4_K_M".into()),
            ctx: Some(32768),
            repo: Some("o/r".into()),
            path: "/p".into(),
        }];
        let mut out = Vec::new();
        table(&mut out, &rows).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text, "ID  SIZE    ARCH    QUANT   CTX    FROM\nm   253 MB  gemma3  Q4_K_M  32768  hf:o/r\n");
    }
}
