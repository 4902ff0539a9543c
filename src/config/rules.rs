//! `[[signed_url]]` and `[[rate_limit]]` entries: their settings and the checks of their
//! shape. `signing` and `limits::rate` apply them.

use std::path::PathBuf;

/// Most `[[signed_url]]` rules.
pub const MAX_SIGNED_URL_RULES: usize = 64;

/// One `[[signed_url]]` entry of the configuration.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Canonical path prefix the rule covers (starts with `/`; `/beta/` covers `/beta/x`).
    pub prefix: String,
    /// The key file: lines of `KEY_ID HEX_SECRET` (at least 32 bytes), `#` comments.
    pub key_file: PathBuf,
    /// Query parameter holding the expiry (Unix seconds).
    #[serde(default = "default_expires_param")]
    pub expires_param: String,
    /// Query parameter holding the key id.
    #[serde(default = "default_key_id_param")]
    pub key_id_param: String,
    /// Query parameter holding the signature.
    #[serde(default = "default_signature_param")]
    pub signature_param: String,
}

/// `expires`, the default expiry parameter.
pub fn default_expires_param() -> String {
    "expires".into()
}
/// `key_id`, the default key-id parameter.
pub fn default_key_id_param() -> String {
    "key_id".into()
}
/// `signature`, the default signature parameter.
pub fn default_signature_param() -> String {
    "signature".into()
}

impl RuleConfig {
    /// Checks the entry's own shape (the key file is read by `Signing::load`).
    pub fn validate(&self) -> Result<(), String> {
        if !self.prefix.starts_with('/') {
            return Err(format!("prefix '{}' must start with '/'", self.prefix));
        }
        let params = [
            &self.expires_param,
            &self.key_id_param,
            &self.signature_param,
        ];
        if params
            .iter()
            .any(|p| p.is_empty() || p.contains(['&', '=', '#']))
        {
            return Err("parameter names must be non-empty, without '&', '=' or '#'".into());
        }
        if params[0] == params[1] || params[1] == params[2] || params[0] == params[2] {
            return Err("expires_param, key_id_param and signature_param must differ".into());
        }
        Ok(())
    }
}

/// Most `[[rate_limit]]` rules.
pub const MAX_RATE_LIMIT_RULES: usize = 64;

/// One `[[rate_limit]]` entry: responses under a path prefix get their own rate (for example
/// a slower one for a beta channel), in place of `limit_rate_bytes_per_s`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixRate {
    /// Canonical path prefix the rule covers (starts with `/`; `/beta/` covers `/beta/x`).
    pub prefix: String,
    /// Bytes per second of each response under the prefix; 0 = not limited.
    pub rate_bytes_per_s: u64,
    /// Bytes each response sends at full speed first.
    #[serde(default)]
    pub after_bytes: u64,
}

impl PrefixRate {
    /// Checks the entry's own shape.
    pub fn validate(&self) -> Result<(), String> {
        if !self.prefix.starts_with('/') {
            return Err(format!("prefix '{}' must start with '/'", self.prefix));
        }
        Ok(())
    }
}
