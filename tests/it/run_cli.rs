//! `corral run` end to end on the real models: output equals llama.cpp's greedy
//! continuation, and bad model files give one clear error line and a non-zero exit.

use std::time::Duration;

use crate::common::*;
use corral_engine::Engine;

const DEADLINE: Duration = Duration::from_secs(120);

fn fixture(name: &str) -> serde_json::Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/tests/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// llama.cpp's greedy continuation for fixture case `name`, first `n` tokens, as text.
fn oracle_text(model: &str, fixture_name: &str, case: &str, n: usize) -> String {
    let engine = Engine::load(&model_path(model)).unwrap();
    let fx = fixture(fixture_name);
    let g = fx["greedy"].as_array().unwrap().iter().find(|g| g["name"] == case).unwrap();
    // The engine computes every row the way llama.cpp computes a one-token batch (batch-invariant
    // numerics, docs/engine.md), so its greedy output is llama.cpp's serial greedy output.
    let ids: Vec<u32> =
        g["serial_tokens"].as_array().unwrap()[..n].iter().map(|v| v.as_u64().unwrap() as u32).collect();
    engine.tokenizer.decode(&ids)
}

#[test]
fn smollm2_chat_greedy_equals_llama_cpp() {
    let path = model_path(SMOLLM);
    let out = run_corral(
        &[
            "run",
            "--model",
            path.to_str().unwrap(),
            "--chat",
            "--prompt",
            "Write a haiku about the sea.",
            "--temperature",
            "0",
            "--max-tokens",
            "24",
        ],
        DEADLINE,
    );
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim_end_matches('\n'), oracle_text(SMOLLM, "oracle-smollm2.json", "haiku", 24));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("prefill") && stderr.contains("decode") && stderr.contains("tok/s"), "{stderr}");
}

#[test]
fn gemma3_raw_completion_by_model_id_equals_llama_cpp() {
    let dir = models_dir();
    let out = run_corral(
        &[
            "run",
            "--models-dir",
            dir.to_str().unwrap(),
            "--model",
            "gemma-3-270m-q4_k_m",
            "--prompt",
            "def fibonacci(n):\n",
            "--temperature",
            "0",
            "--max-tokens",
            "24",
        ],
        DEADLINE,
    );
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim_end_matches('\n'), oracle_text(GEMMA, "oracle-gemma3.json", "fib", 24));
}

#[test]
fn seeded_sampling_is_reproducible() {
    let path = model_path(SMOLLM);
    let args = [
        "run",
        "--model",
        path.to_str().unwrap(),
        "--prompt",
        "Once upon a time",
        "--temperature",
        "1.0",
        "--seed",
        "42",
        "--max-tokens",
        "20",
    ];
    let a = run_corral(&args, DEADLINE);
    let b = run_corral(&args, DEADLINE);
    assert!(a.status.success() && b.status.success());
    assert_eq!(a.stdout, b.stdout);
    assert!(!a.stdout.is_empty());
}

fn expect_clean_failure(model_arg: &str, needle: &str) {
    let out = run_corral(&["run", "--model", model_arg, "--prompt", "hi"], DEADLINE);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure for {model_arg}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line expected, got: {stderr}");
    assert!(lines[0].starts_with("corral: error:") && lines[0].contains(needle), "{stderr}");
}

/// A GGUF header with one string metadata entry and no tensors.
fn gguf_with_arch(arch: &str) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend(b"GGUF");
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes()); // tensors
    b.extend(1u64.to_le_bytes()); // metadata entries
    let key = b"general.architecture";
    b.extend((key.len() as u64).to_le_bytes());
    b.extend(key);
    b.extend(8u32.to_le_bytes()); // string
    b.extend((arch.len() as u64).to_le_bytes());
    b.extend(arch.as_bytes());
    b
}

#[test]
fn bad_model_files_fail_with_one_clear_line() {
    let tmp = TempDir::new("badmodels");
    let missing = tmp.path().join("nope.gguf");
    expect_clean_failure(missing.to_str().unwrap(), "not found");

    let not_gguf = tmp.path().join("junk.gguf");
    std::fs::write(&not_gguf, b"this is not a model file at all").unwrap();
    expect_clean_failure(not_gguf.to_str().unwrap(), "not a GGUF file");

    let arch = tmp.path().join("mamba.gguf");
    std::fs::write(&arch, gguf_with_arch("mamba")).unwrap();
    expect_clean_failure(arch.to_str().unwrap(), "unsupported model architecture \"mamba\"");

    let full = std::fs::read(model_path(SMOLLM)).unwrap();
    let truncated = tmp.path().join("truncated.gguf");
    std::fs::write(&truncated, &full[..full.len() / 2]).unwrap();
    expect_clean_failure(truncated.to_str().unwrap(), "truncated");

    let header_cut = tmp.path().join("header-cut.gguf");
    std::fs::write(&header_cut, &full[..4096]).unwrap();
    expect_clean_failure(header_cut.to_str().unwrap(), "not a valid GGUF file");

    let dir_as_model = tmp.path().join("dir.gguf");
    std::fs::create_dir(&dir_as_model).unwrap();
    expect_clean_failure(dir_as_model.to_str().unwrap(), "not a regular file");
}

#[test]
fn sampling_flags_out_of_range_refuse_to_start_naming_the_flag() {
    for (flag, value) in [
        ("--temperature", "9"),
        ("--top-p", "1.5"),
        ("--top-k", "2000000"),
        ("--min-p", "-0.1"),
        ("--grammar", "maybe"),
    ] {
        for verb in ["serve", "engine"] {
            let arg = format!("{flag}={value}");
            let mut args = vec![verb, &arg];
            if verb == "engine" {
                args.extend(["--model", "x.gguf", "--socket", "/nonexistent/s"]);
            }
            let out = run_corral(&args, DEADLINE);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{verb} {flag} {value} started");
            assert!(err.contains(flag), "{verb} {flag} {value}: {err}");
        }
    }
}

/// `--device cuda` where CUDA cannot run (every CI machine) is one error line naming what
/// is missing and exit 1, never a panic; `--device cpu` runs; a bad device name is a
/// usage error. On a GPU machine the CUDA run must simply succeed.
#[test]
fn device_flag_fails_clearly_without_cuda() {
    let path = model_path(SMOLLM);
    let args = |device: &str| {
        ["run", "--model", path.to_str().unwrap(), "--prompt", "Hi", "--max-tokens", "2", "--device", device]
            .map(str::to_owned)
    };
    let run = |device: &str| {
        let a = args(device);
        run_corral(&a.iter().map(String::as_str).collect::<Vec<_>>(), DEADLINE)
    };
    let cpu = run("cpu");
    assert!(cpu.status.success(), "stderr: {}", String::from_utf8_lossy(&cpu.stderr));
    let cuda = run("cuda");
    let stderr = String::from_utf8_lossy(&cuda.stderr);
    if !cuda.status.success() {
        assert_eq!(cuda.status.code(), Some(1), "{stderr}");
        let line = stderr.lines().last().unwrap_or_default();
        assert!(line.starts_with("corral: error: CUDA unavailable: "), "{stderr}");
        assert_eq!(line.matches("not found").count().max(1), 1, "said once: {line}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let bad = run("metal");
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected auto, cpu, cuda or cuda:N"));
}
