use clap::Args;

use super::*;

fn serve() -> clap::Command {
    crate::serve::ServeArgs::augment_args(clap::Command::new("serve"))
}

fn parse_ok(text: &str) -> Config {
    parse("corral.toml", text, &serve()).unwrap_or_else(|e| panic!("{e}"))
}

fn parse_err(text: &str) -> String {
    parse("corral.toml", text, &serve()).unwrap_err().to_string()
}

fn args(c: &Config) -> Vec<String> {
    c.options.iter().flat_map(|o| o.args.clone()).collect()
}

#[test]
fn options_become_their_flags() {
    let c = parse_ok(
        "port = 9000\nmodel-pool = 2\nkeep-alive = \"5m\"\nno-open = true\nno-ssd-cache = false\n\
         temperature = 0.5\nthinking = false\nallow-host = [\"a.lan\", \"b.lan\"]\n",
    );
    assert_eq!(
        args(&c),
        [
            "--port=9000",
            "--model-pool=2",
            "--keep-alive=5m",
            "--no-open",
            "--temperature=0.5",
            "--thinking=false",
            "--allow-host=a.lan",
            "--allow-host=b.lan"
        ]
    );
    assert_eq!(c.options[1].key, "model-pool");
    assert_eq!(c.options[1].line, 2);
    assert!(c.models.is_empty());
}

#[test]
fn unknown_keys_name_their_line() {
    assert_eq!(
        parse_err("port = 9000\n\n# pool\nmodle-pool = 2\n"),
        "corral.toml:4: unknown key `modle-pool` (keys are `corral serve` flag names)"
    );
    assert!(parse_err("config = \"x.toml\"\n").starts_with("corral.toml:1: unknown key `config`"));
    let e = parse_err("[models.a]\npath = \"/m/a.gguf\"\n\nctxx = 4\n");
    assert!(e.starts_with("corral.toml:4: unknown key `ctxx` in [models.a]"), "{e}");
}

#[test]
fn bad_values_name_key_and_line() {
    let e = parse_err("host = \"127.0.0.1\"\nport = \"eighty\"\n");
    assert!(e.starts_with("corral.toml:2: `port`: invalid value 'eighty'"), "{e}");
    let e = parse_err("keep-alive = \"5 minutes\"\n");
    assert!(e.starts_with("corral.toml:1: `keep-alive`:"), "{e}");
    assert!(parse_err("no-open = \"yes\"\n").contains("`no-open` must be true or false"));
    assert!(parse_err("port = [1]\n").starts_with("corral.toml:1:"));
    let e = parse_err("[models.a]\npath = \"/a.gguf\"\nbatch = 0\n");
    assert!(e.starts_with("corral.toml:3: [models.a] `batch`: must be a whole number from 1 to 256"), "{e}");
    assert!(parse_err("[models.a]\ntemperature = 9.0\npath = \"/a\"\n").contains("from 0 to 5"));
    // TOML syntax errors carry their line too.
    assert!(parse_err("port = 1\nmodel-pool = \n").starts_with("corral.toml:2:"));
}

#[test]
fn model_tables() {
    let c = parse_ok(
        r#"
port = 1

[models.small]
path = "/m/small.gguf"
aliases = ["default", "s"]
pin = true
ctx = 8192
batch = 4
temperature = 0.2
top-p = 0.9
top-k = 40
thinking = true

[models.qwen]
repo = "Qwen/Qwen3-0.6B-GGUF"
file = "Qwen3-0.6B-Q8_0.gguf"

[models.found-elsewhere]
min-p = 0.05
"#,
    );
    assert_eq!(c.models.len(), 3);
    let s = &c.models[0];
    assert_eq!((s.id.as_str(), s.line), ("small", 4));
    assert_eq!(s.source, Some(ModelSource::Path("/m/small.gguf".into())));
    assert_eq!(s.settings.aliases, ["default", "s"]);
    assert!(s.settings.pin);
    assert_eq!((s.settings.ctx, s.settings.batch), (Some(8192), Some(4)));
    assert_eq!((s.settings.sampling.temperature, s.settings.sampling.top_p), (Some(0.2), Some(0.9)));
    assert_eq!((s.settings.sampling.top_k, s.settings.sampling.thinking), (Some(40), Some(true)));
    assert_eq!(
        c.models[1].source,
        Some(ModelSource::Hub { repo: "Qwen/Qwen3-0.6B-GGUF".into(), file: "Qwen3-0.6B-Q8_0.gguf".into() })
    );
    assert_eq!(c.models[2].source, None);
    assert_eq!(c.models[2].settings.sampling.min_p, Some(0.05));
}

#[test]
fn model_sources_are_one_of_path_or_repo_and_file() {
    assert!(parse_err("[models.a]\nrepo = \"o/n\"\n").contains("`repo` needs `file` too"));
    assert!(parse_err("[models.a]\nfile = \"x.gguf\"\n").contains("`file` needs `repo` too"));
    assert!(parse_err("[models.a]\npath = \"/x\"\nrepo = \"o/n\"\nfile = \"f\"\n").contains("not both"));
    assert!(parse_err("[models.a]\nrepo = \"nope\"\nfile = \"f\"\n").contains("ORG/NAME"));
    assert!(parse_err("[models.\"bad id\"]\npath = \"/x\"\n").starts_with("corral.toml:1: [models.bad id]"));
    assert!(parse_err("models = 3\n").contains("must be a table"));
}

#[test]
fn empty_file_is_empty_config() {
    assert_eq!(parse_ok(""), Config::default());
    assert_eq!(parse_ok("# nothing\n"), Config::default());
}

#[test]
fn an_upstream_table_names_its_replicas_key_timeouts_and_apis() {
    let c = parse_ok(
        r#"upstream = ["quick=http://q:8000"]

[models.big]
upstream = ["http://gpu1:8000/v1", "https://gpu2.lan"]
upstream-model = "meta-llama/Llama-3.1-70B-Instruct"
api-key-env = "VLLM_KEY"
aliases = ["llama-70b"]
connect-timeout = "2s"
timeout = 900
health-interval = "500ms"
apis = ["chat", "completions", "responses"]

[models.one]
upstream = "http://h:1"
"#,
    );
    assert_eq!(args(&c), ["--upstream=quick=http://q:8000"], "the flag's key works too");
    let Some(ModelSource::Upstream(s)) = &c.models[0].source else { panic!("{:?}", c.models[0]) };
    let urls: Vec<String> = s.replicas.iter().map(ToString::to_string).collect();
    assert_eq!(urls, ["http://gpu1:8000", "https://gpu2.lan"]);
    assert_eq!((s.remote_name(), s.api_key_env.as_deref()), ("meta-llama/Llama-3.1-70B-Instruct", Some("VLLM_KEY")));
    assert_eq!(s.aliases, ["llama-70b"]);
    use std::time::Duration;
    assert_eq!(
        (s.connect_timeout, s.timeout, s.health_interval),
        (Duration::from_secs(2), Some(Duration::from_secs(900)), Duration::from_millis(500))
    );
    use corral_gateway::Api;
    assert_eq!(s.apis.as_deref(), Some(&[Api::Chat, Api::Completions, Api::Responses][..]));
    let Some(ModelSource::Upstream(one)) = &c.models[1].source else { panic!() };
    assert_eq!((one.remote_name(), one.apis.as_ref(), one.timeout), ("one", None, None));
}

#[test]
fn an_upstream_table_takes_no_local_keys_and_its_keys_need_upstream() {
    let e = parse_err("[models.a]\nupstream = \"http://h\"\nctx = 4096\n");
    assert!(e.contains("`ctx` does not apply to an upstream model"), "{e}");
    let e = parse_err("[models.a]\nupstream = \"http://h\"\npath = \"/m.gguf\"\n");
    assert!(e.contains("`path` does not apply"), "{e}");
    let e = parse_err("[models.a]\npath = \"/m.gguf\"\napi-key-env = \"K\"\n");
    assert!(e.contains("no `upstream` URL"), "{e}");
    assert!(parse_err("[models.a]\nupstream = \"h:1\"\n").contains("no scheme"));
    assert!(parse_err("[models.a]\nupstream = []\n").contains("at least one URL"));
    assert!(parse_err("[models.a]\nupstream = \"http://h\"\napis = [\"embeddings\"]\n").contains("unknown API"));
    assert!(parse_err("[models.a]\nupstream = \"http://h\"\ntimeout = \"0s\"\n").contains("more than 0"));
    let e = parse_err("[models.a]\nupstream = \"http://h\"\napi-key-env = \"K=sk-123\"\n");
    assert!(e.contains("name of an environment variable") && !e.contains("sk-123"), "{e}");
    let e = parse_err("upstream = [\"nourl\"]\n");
    assert!(e.contains("`upstream`") && e.contains("ID=URL"), "{e}");
    assert!(parse_err("[models.a]\nfoo = 1\n").contains("for an upstream model: upstream, upstream-model"));
}
