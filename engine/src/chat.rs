//! Chat templates: the model's own Jinja template (`tokenizer.chat_template`) rendered
//! with minijinja the way Hugging Face and llama.cpp's server render it (trim/lstrip
//! blocks, Python string methods, `raise_exception`, `tojson` as Python's `json.dumps`),
//! or, for a file without one, a built-in template for its family (`builtin_templates`),
//! as llama.cpp and Ollama do.

use minijinja::value::Kwargs;
use minijinja::{Environment, ErrorKind, Value, context};
use serde::Serialize;

use crate::builtin_templates::Builtin;
use crate::error::{Error, Result};

/// Rendering budget: a template that loops forever fails instead of hanging a request.
const FUEL: u64 = 2_000_000;

/// The most text a template may render. Far above any prompt a context window holds
/// (the gateway takes request bodies of 8 MiB by default), far below what would exhaust
/// memory: fuel counts instructions, not bytes, and one instruction can emit a string of
/// up to 100 MB (minijinja's cap on `"x" * n`).
const MAX_RENDER_BYTES: usize = 64 << 20;

/// The render's output, failing the write that would pass `MAX_RENDER_BYTES`.
#[derive(Default)]
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDER_BYTES {
            return Err(std::io::Error::other("too long"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One message as templates see it (the Hugging Face shape). The server always sets
/// `content` (`""` on an assistant turn that only carries `tool_calls`, as llama.cpp).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<String>,
    /// `[{id, type: "function", function: {name, arguments: {…}}}]`, arguments as an object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant turn's reasoning, for templates that render it back (gpt-oss's reads
    /// `thinking`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.to_owned(),
            content: Some(content.to_owned()),
            tool_calls: None,
            tool_call_id: None,
            name: None,
            thinking: None,
        }
    }
}

/// Where a template came from (reported in logs and `/v1/models`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateSource {
    Gguf,
    Builtin(&'static str),
    /// Given on the command line (`--chat-template FILE`).
    File,
}

pub struct ChatTemplate {
    env: Environment<'static>,
    source: TemplateSource,
    text: String,
    bos: String,
    eos: String,
    /// The tokenizer adds BOS itself: drop a template's leading BOS text.
    strip_bos: bool,
}

impl ChatTemplate {
    /// `gguf_template` is the file's `tokenizer.chat_template`, if any; `builtin` the
    /// family's format for a file without one (`builtin_templates::choose`).
    pub fn new(
        gguf_template: Option<&str>,
        builtin: Option<Builtin>,
        bos: &str,
        eos: &str,
        tokenizer_adds_bos: bool,
    ) -> Result<Self> {
        let (source, text) = match (gguf_template, builtin) {
            (Some(t), _) if !t.trim().is_empty() => (TemplateSource::Gguf, t.to_owned()),
            (_, Some(b)) => (TemplateSource::Builtin(b.name), b.text.to_owned()),
            (_, None) => {
                return Err(Error::Template("the model file has no chat template and no built-in one fits".into()));
            }
        };
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_filter("tojson", tojson);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", text.clone()).map_err(|e| Error::Template(describe(&e)))?;
        Ok(Self { env, source, text, bos: bos.to_owned(), eos: eos.to_owned(), strip_bos: tokenizer_adds_bos })
    }

    /// A template given on the command line, replacing the model's.
    pub fn from_file_text(text: &str, bos: &str, eos: &str, tokenizer_adds_bos: bool) -> Result<Self> {
        let mut t = Self::new(Some(text), None, bos, eos, tokenizer_adds_bos)?;
        t.source = TemplateSource::File;
        Ok(t)
    }

    pub fn source(&self) -> &TemplateSource {
        &self.source
    }

    /// The template's source text (tool-format detection reads it).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Render a conversation; `tools` (the OpenAI `tools` list) is passed to templates
    /// that render tools themselves.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with(messages, tools, add_generation_prompt, &serde_json::Map::new())
    }

    /// As `render`, with extra template variables (`chat_template_kwargs`, such as
    /// `enable_thinking`); they never replace the conversation's own variables.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let tmpl = self.env.get_template("chat").map_err(|e| Error::Template(describe(&e)))?;
        let own = context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos,
            eos_token => &self.eos,
        };
        // minijinja's context merge: earlier values win, so ours come first.
        let mut out = Capped::default();
        tmpl.render_captured_to(minijinja::context! { ..own, ..Value::from_serialize(kwargs) }, &mut out).map_err(
            |e| match e.kind() {
                ErrorKind::WriteFailure => {
                    Error::Template(format!("the rendered prompt is longer than {} MiB", MAX_RENDER_BYTES >> 20))
                }
                _ => Error::Template(describe(&e)),
            },
        )?;
        // minijinja writes whole `str`s, so the bytes are UTF-8; the check costs one pass.
        let out =
            String::from_utf8(out.0).map_err(|_| Error::Template("the template rendered invalid UTF-8".into()))?;
        Ok(match (self.strip_bos && !self.bos.is_empty(), out.strip_prefix(self.bos.as_str())) {
            (true, Some(rest)) => rest.to_owned(),
            _ => out,
        })
    }
}

/// `tojson` as Hugging Face and llama.cpp render it: Python's `json.dumps` with
/// `ensure_ascii=False` (`", "` and `": "` between items, `","` when indented, keys in
/// their given order, no HTML escapes), where minijinja's own writes compact JSON with
/// `<`, `>`, `&` and `'` escaped. Tool lists and tool-call arguments reach the model
/// through it (Qwen 2.5, Qwen 3, Llama 3.x templates), so the prompt must be the one
/// the model was trained on. Arguments as Python's: `indent`, `separators`,
/// `ensure_ascii`, `sort_keys`.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent = match indent.map_or_else(|| kwargs.get::<Option<Value>>("indent"), |v| Ok(Some(v)))? {
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(usize::try_from(v)?),
        None => None,
    };
    let (item, key) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(_) => return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "separators must be a pair")),
        None => ((if indent.is_some() { "," } else { ", " }).to_owned(), ": ".to_owned()),
    };
    let ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON").with_source(e))?;
    let mut out = String::new();
    let fmt = JsonFmt { indent, item: &item, key: &key, ascii, sort };
    fmt.write(&mut out, &json, 0);
    Ok(Value::from_safe_string(out))
}

struct JsonFmt<'a> {
    indent: Option<usize>,
    item: &'a str,
    key: &'a str,
    ascii: bool,
    sort: bool,
}

impl JsonFmt<'_> {
    fn write(&self, out: &mut String, v: &serde_json::Value, level: usize) {
        use serde_json::Value as J;
        match v {
            J::String(s) => self.string(out, s),
            J::Array(items) => self.container(out, ('[', ']'), level, items.iter().map(|v| (None, v)).collect()),
            J::Object(map) => {
                let mut entries: Vec<_> = map.iter().map(|(k, v)| (Some(k.as_str()), v)).collect();
                if self.sort {
                    entries.sort_by_key(|(k, _)| *k);
                }
                self.container(out, ('{', '}'), level, entries)
            }
            // null, booleans and numbers are written as serde_json writes them.
            other => out.push_str(&other.to_string()),
        }
    }

    fn container(
        &self,
        out: &mut String,
        (open, close): (char, char),
        level: usize,
        entries: Vec<(Option<&str>, &serde_json::Value)>,
    ) {
        out.push(open);
        let newline = |out: &mut String, level: usize| {
            if let Some(n) = self.indent {
                out.push('\n');
                out.extend(std::iter::repeat_n(' ', n * level));
            }
        };
        let empty = entries.is_empty();
        for (i, (k, v)) in entries.into_iter().enumerate() {
            if i > 0 {
                out.push_str(self.item);
            }
            newline(out, level + 1);
            if let Some(k) = k {
                self.string(out, k);
                out.push_str(self.key);
            }
            self.write(out, v, level + 1);
        }
        if !empty {
            newline(out, level);
        }
        out.push(close);
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// `strftime_now(format)` as llama.cpp's and Hugging Face's template hosts give it (gpt-oss
/// and Llama 3.x templates write today's date with it): the current UTC time, with the
/// conversions those templates use (`%Y %m %d %H %M %S %y %b %B %%`).
fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

fn strftime(format: &str, secs: u64) -> std::result::Result<String, minijinja::Error> {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian calendar, in 400-year eras).
    let days = (secs / 86_400) as i64 + 719_468;
    let (era, doe) = (days.div_euclid(146_097), days.rem_euclid(146_097));
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('M') => out.push_str(&format!("{m:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('B') => out.push_str(MONTHS[month as usize - 1]),
            Some('b') => out.push_str(&MONTHS[month as usize - 1][..3]),
            Some('%') => out.push('%'),
            other => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: unsupported conversion %{}", other.map(String::from).unwrap_or_default()),
                ));
            }
        }
    }
    Ok(out)
}

fn describe(e: &minijinja::Error) -> String {
    match e.detail() {
        Some(d) => format!("{} ({d})", e.kind()),
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    fn msgs() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", " Be brief. "),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello"),
            ChatMessage::new("user", "Bye "),
        ]
    }

    #[test]
    fn renders_gguf_template() {
        let t = ChatTemplate::new(Some(CHATML), None, "<s>", "</s>", false).unwrap();
        let out = t.render(&msgs()[1..2], None, true).unwrap();
        assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(t.source(), &TemplateSource::Gguf);
    }

    #[test]
    fn builtin_gemma_matches_llama_cpp_format() {
        let t = ChatTemplate::new(
            None,
            crate::builtin_templates::choose(crate::config::Arch::Gemma3, |_| false),
            "<bos>",
            "<eos>",
            true,
        )
        .unwrap();
        let out = t.render(&msgs(), None, true).unwrap();
        assert_eq!(
            out,
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(t.source(), &TemplateSource::Builtin("gemma"));
    }

    #[test]
    fn template_errors_are_clear() {
        let bad = ChatTemplate::new(Some("{% for x in %}"), None, "", "", false);
        assert!(matches!(bad, Err(Error::Template(_))));
        let raising =
            ChatTemplate::new(Some("{{ raise_exception('roles must alternate') }}"), None, "", "", false).unwrap();
        let err = raising.render(&msgs(), None, true).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
        let looping =
            ChatTemplate::new(Some("{% for i in range(100000000) %}{{ i }}{% endfor %}"), None, "", "", false).unwrap();
        assert!(looping.render(&msgs(), None, true).is_err(), "fuel limit stops runaway templates");
        // Few instructions, huge output: every `i * j` repeats a digit up to 99,999 times.
        let wide = "{% for i in range~(100000) %}{% for j in range(100000) %}{{ i * j }}{% endfor %}{% endfor %}";
        let wide = ChatTemplate::new(Some(wide), None, "", "", false).unwrap();
        let err = wide.render(&msgs(), None, true).unwrap_err().to_string();
        assert!(err.contains("longer than 64 MiB"), "{err}");
        assert!(ChatTemplate::new(None, None, "", "", false).is_err());
    }

    #[test]
    fn template_bos_is_dropped_when_tokenizer_adds_it() {
        let t = ChatTemplate::new(Some("{{ bos_token }}{{ messages[0].content }}"), None, "<s>", "", true).unwrap();
        assert_eq!(t.render(&msgs()[1..2], None, false).unwrap(), "Hi");
    }

    #[test]
    fn template_kwargs_reach_the_template_but_never_replace_the_conversation() {
        let src = "{% if enable_thinking %}T{% else %}F{% endif %}{{ messages[0].content }}";
        let t = ChatTemplate::new(Some(src), None, "", "", false).unwrap();
        let mut kw = serde_json::Map::new();
        kw.insert("enable_thinking".into(), true.into());
        kw.insert("messages".into(), serde_json::json!([{"role": "user", "content": "X"}]));
        assert_eq!(t.render_with(&msgs()[1..2], None, false, &kw).unwrap(), "THi");
        assert_eq!(t.render(&msgs()[1..2], None, false).unwrap(), "FHi");
    }

    /// `tojson` writes what Python's `json.dumps(ensure_ascii=False)` writes (Hugging
    /// Face's and llama.cpp's renderings): the spaced separators, keys in the order given,
    /// nothing HTML-escaped; its arguments as Python's.
    #[test]
    fn tojson_is_pythons_json_dumps() {
        let render = |src: &str| {
            let t = ChatTemplate::new(Some(src), None, "", "", false).unwrap();
            let tools = serde_json::json!([{"type": "function", "function": {"name": "f", "description": "a<b & 'c'",
                "parameters": {"z": [1, 2.5, true, null], "a": "é\n\"\u{1}", "m": {}}}}]);
            t.render(&msgs()[..1], Some(&tools), false).unwrap()
        };
        assert_eq!(
            render("{{ tools[0] | tojson }}"),
            r#"{"type": "function", "function": {"name": "f", "description": "a<b & 'c'", "parameters": {"z": [1, 2.5, true, null], "a": "é\n\"\u0001", "m": {}}}}"#
        );
        assert_eq!(
            render("{{ tools[0].function.parameters | tojson(indent=2, sort_keys=true) }}"),
            "{\n  \"a\": \"é\\n\\\"\\u0001\",\n  \"m\": {},\n  \"z\": [\n    1,\n    2.5,\n    true,\n    null\n  ]\n}"
        );
        assert_eq!(
            render(
                "{{ tools[0].function.parameters.a | tojson(ensure_ascii=true) }}{{ [1, 2] | tojson(separators=[',', ':']) }}"
            ),
            r#""\u00e9\n\"\u0001"[1,2]"#
        );
        // A map's own order, too, when a template iterates it.
        assert_eq!(render("{% for k in tools[0].function.parameters %}{{ k }}{% endfor %}"), "zam");
    }

    #[test]
    fn strftime_writes_civil_dates() {
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", 0).unwrap(), "1970-01-01 00:00:00");
        // 2024-02-29 (a leap day) 13:05:09 UTC, and 2000-12-31.
        assert_eq!(strftime("%d %b %Y, %B %y %%", 1_709_211_909).unwrap(), "29 Feb 2024, February 24 %");
        assert_eq!(strftime("%Y-%m-%d", 978_220_800).unwrap(), "2000-12-31");
        assert!(strftime("%Q", 0).is_err());
        let t = ChatTemplate::new(Some("{{ strftime_now('%Y') }}"), None, "", "", false).unwrap();
        assert!(t.render(&msgs()[..1], None, false).unwrap().parse::<u32>().unwrap() >= 2025);
    }

    #[test]
    fn python_string_methods_work() {
        let t = ChatTemplate::new(Some("{{ messages[0].content.strip().upper() }}"), None, "", "", false).unwrap();
        assert_eq!(t.render(&msgs()[..1], None, false).unwrap(), "BE BRIEF.");
    }
}
