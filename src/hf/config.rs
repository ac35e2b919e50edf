//! `Config`: the Qwen3 hyper-parameters, read straight from a Hugging Face `config.json`.
//!
//! Both key styles are accepted: transformers 4.x (top-level `rope_theta`, `torch_dtype`, as in the
//! published Qwen3-0.6B) and transformers 5 (`rope_parameters: {rope_theta, rope_type}`, `dtype`).
//! [`Config::validate`] checks what the engine relies on and rejects what it does not implement.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Qwen3 model hyper-parameters (the subset of `config.json` the engine uses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Rows of `embed_tokens` (151,936 for Qwen3).
    pub vocab_size: usize,
    /// Residual-stream width (1,024 for Qwen3-0.6B).
    pub hidden_size: usize,
    /// MLP width (3,072).
    pub intermediate_size: usize,
    /// Decoder layers (28).
    pub num_hidden_layers: usize,
    /// Query heads (16).
    pub num_attention_heads: usize,
    /// Key/value heads (8): grouped-query attention.
    pub num_key_value_heads: usize,
    /// Per-head width (128); defaults to hidden_size / num_attention_heads.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Longest context the model was trained for (40,960).
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon (1e-6).
    pub rms_norm_eps: f64,
    /// RoPE base, transformers 4.x style.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// RoPE parameters, transformers 5 style.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<RopeParameters>,
    /// Must be null: scaled RoPE is not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Value>,
    /// Whether `lm_head` shares `embed_tokens` (true for Qwen3-0.6B).
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Must be false: no q/k/v bias.
    #[serde(default)]
    pub attention_bias: bool,
    /// Must be false: no sliding-window attention.
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Must be "silu".
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Weight dtype, transformers 4.x key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_dtype: Option<String>,
    /// Weight dtype, transformers 5 key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// Beginning-of-sequence token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<u32>,
    /// Architecture names, e.g. `["Qwen3ForCausalLM"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub architectures: Vec<String>,
    /// "qwen3".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_type: Option<String>,
}

/// transformers-5 `rope_parameters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeParameters {
    /// RoPE base.
    pub rope_theta: f64,
    /// Must be "default".
    #[serde(default = "default_rope_type")]
    pub rope_type: String,
}

fn default_max_pos() -> usize {
    40_960
}
fn default_act() -> String {
    "silu".into()
}
fn default_rope_type() -> String {
    "default".into()
}

impl Config {
    /// Reads and validates `path` (a `config.json`).
    pub fn from_file(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Config::from_json(&text, path)
    }

    /// Parses and validates JSON text; `path` is only used in error messages.
    pub fn from_json(text: &str, path: &Path) -> Result<Config> {
        let cfg: Config = serde_json::from_str(text).map_err(|e| Error::Config {
            path: path.into(),
            msg: e.to_string(),
        })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// RoPE base, from whichever key style the file used.
    pub fn rope_theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .map(|r| r.rope_theta)
            .or(self.rope_theta)
            .unwrap_or(10_000.0)
    }

    /// Query-projection width: heads × head_dim.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim()
    }

    /// Key/value-projection width: kv heads × head_dim.
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim()
    }

    /// Query heads per key/value head.
    pub fn gqa_ratio(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Checks what the engine relies on; `path` names the file in errors.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let bad = |msg: String| {
            Err(Error::Config {
                path: path.into(),
                msg,
            })
        };
        let unsupported = |msg: String| {
            Err(Error::Unsupported {
                path: path.into(),
                msg,
            })
        };
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim()),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive"));
            }
        }
        if self.vocab_size > (1 << 24)
            || self.hidden_size > 16_384
            || self.intermediate_size > 65_536
        {
            return bad(format!(
                "sizes out of range (vocab {}, hidden {}, intermediate {})",
                self.vocab_size, self.hidden_size, self.intermediate_size
            ));
        }
        if self.num_hidden_layers > 1024 || self.num_attention_heads > 1024 {
            return bad("num_hidden_layers and num_attention_heads must be at most 1024".into());
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {} (GQA)",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim() % 16 != 0 || self.head_dim() > 512 {
            return bad(format!(
                "head_dim {} must be a multiple of 16, at most 512",
                self.head_dim()
            ));
        }
        if self.head_dim.is_none() && self.hidden_size % self.num_attention_heads != 0 {
            return bad(
                "hidden_size is not divisible by num_attention_heads and no head_dim is given"
                    .into(),
            );
        }
        if self.hidden_size % 32 != 0 || self.intermediate_size % 32 != 0 {
            return bad(format!(
                "hidden_size {} and intermediate_size {} must be multiples of 32",
                self.hidden_size, self.intermediate_size
            ));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1e-2) {
            return bad(format!(
                "rms_norm_eps {} must be in (0, 0.01)",
                self.rms_norm_eps
            ));
        }
        let theta = self.rope_theta();
        if !(theta.is_finite() && theta > 1.0) {
            return bad(format!(
                "rope_theta {theta} must be a finite number above 1"
            ));
        }
        if let Some(v) = &self.rope_scaling {
            if !v.is_null() {
                return unsupported(format!("rope_scaling {v} (only null is supported)"));
            }
        }
        if let Some(r) = &self.rope_parameters {
            if r.rope_type != "default" {
                return unsupported(format!(
                    "rope_parameters.rope_type {:?} (only \"default\")",
                    r.rope_type
                ));
            }
        }
        if self.attention_bias {
            return unsupported("attention_bias = true (Qwen3 has no q/k/v bias)".into());
        }
        if self.use_sliding_window {
            return unsupported("use_sliding_window = true".into());
        }
        if self.hidden_act != "silu" {
            return unsupported(format!("hidden_act {:?} (only \"silu\")", self.hidden_act));
        }
        if let Some(t) = &self.model_type {
            if t != "qwen3" {
                return unsupported(format!("model_type {t:?} (only \"qwen3\")"));
            }
        }
        Ok(())
    }

    /// Weight count implied by the config (embedding counted once when tied).
    pub fn num_parameters(&self) -> usize {
        tensor_specs(self)
            .iter()
            .map(|(_, s)| s.iter().product::<usize>())
            .sum()
    }
}

/// The tensors a Qwen3 checkpoint must hold for `cfg`, with their shapes, in HF names.
/// `lm_head.weight` is listed only when the embeddings are not tied.
pub fn tensor_specs(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (h, i, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim());
    let mut v = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![cfg.vocab_size, h],
    )];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        v.extend([
            (format!("{p}.input_layernorm.weight"), vec![h]),
            (format!("{p}.self_attn.q_proj.weight"), vec![cfg.q_dim(), h]),
            (
                format!("{p}.self_attn.k_proj.weight"),
                vec![cfg.kv_dim(), h],
            ),
            (
                format!("{p}.self_attn.v_proj.weight"),
                vec![cfg.kv_dim(), h],
            ),
            (format!("{p}.self_attn.o_proj.weight"), vec![h, cfg.q_dim()]),
            (format!("{p}.self_attn.q_norm.weight"), vec![hd]),
            (format!("{p}.self_attn.k_norm.weight"), vec![hd]),
            (format!("{p}.post_attention_layernorm.weight"), vec![h]),
            (format!("{p}.mlp.gate_proj.weight"), vec![i, h]),
            (format!("{p}.mlp.up_proj.weight"), vec![i, h]),
            (format!("{p}.mlp.down_proj.weight"), vec![h, i]),
        ]);
    }
    v.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        v.push(("lm_head.weight".to_string(), vec![cfg.vocab_size, h]));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3_06B: &str = r#"{
      "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
      "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
      "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
      "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
      "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
      "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
      "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
      "use_cache": true, "use_sliding_window": false, "vocab_size": 151936}"#;

    #[test]
    fn reads_the_published_qwen3_config() {
        let c = Config::from_json(QWEN3_06B, Path::new("config.json")).unwrap();
        assert_eq!((c.q_dim(), c.kv_dim(), c.gqa_ratio()), (2048, 1024, 2));
        assert_eq!(c.rope_theta(), 1e6);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.num_parameters(), 596_049_920);
    }

    #[test]
    fn reads_transformers5_keys() {
        let t = QWEN3_06B
            .replace(
                r#""rope_theta": 1000000,"#,
                r#""rope_parameters": {"rope_theta": 500000, "rope_type": "default"},"#,
            )
            .replace("torch_dtype", "dtype");
        let c = Config::from_json(&t, Path::new("c.json")).unwrap();
        assert_eq!(c.rope_theta(), 5e5);
        assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
    }

    #[test]
    fn rejects_what_the_engine_does_not_support() {
        let cases = [
            (
                r#""attention_bias": false"#,
                r#""attention_bias": true"#,
                "attention_bias",
            ),
            (
                r#""rope_scaling": null"#,
                r#""rope_scaling": {"type": "yarn", "factor": 4}"#,
                "rope_scaling",
            ),
            (
                r#""use_sliding_window": false"#,
                r#""use_sliding_window": true"#,
                "use_sliding_window",
            ),
        ];
        for (from, to, word) in cases {
            let err =
                Config::from_json(&QWEN3_06B.replace(from, to), Path::new("x.json")).unwrap_err();
            assert!(matches!(err, Error::Unsupported { .. }), "{word}: {err}");
            assert!(err.to_string().contains(word), "{err}");
        }
        let gqa = QWEN3_06B.replace(r#""num_key_value_heads": 8"#, r#""num_key_value_heads": 5"#);
        let err = Config::from_json(&gqa, Path::new("x.json")).unwrap_err();
        assert!(
            matches!(err, Error::Config { .. }) && err.to_string().contains("GQA"),
            "{err}"
        );
        let eps = QWEN3_06B.replace(r#""rms_norm_eps": 1e-06"#, r#""rms_norm_eps": 0"#);
        assert!(Config::from_json(&eps, Path::new("x.json"))
            .unwrap_err()
            .to_string()
            .contains("rms_norm_eps"));
        let err = Config::from_json("{ not json", Path::new("x.json")).unwrap_err();
        assert!(
            matches!(err, Error::Config { .. }) && err.to_string().contains("x.json"),
            "{err}"
        );
    }
}
