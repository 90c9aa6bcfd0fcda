//! CORS, as vLLM's `--allowed-origins` / `--allowed-methods` / `--allowed-headers` /
//! `--allowed-credentials`. Off unless origins are given: a page on another origin cannot call
//! the server (vLLM allows every origin by default; here `--allowed-origins '*'` does).

/// The allowed origins, methods and headers (`*`: any).
#[derive(Debug, Clone, Default)]
pub struct CorsConfig {
    pub origins: Vec<String>,
    pub methods: Vec<String>,
    pub headers: Vec<String>,
    pub credentials: bool,
}

/// A flag's list: vLLM's JSON form (`'["a", "b"]'`) or comma-separated.
pub fn parse_list(flag: &str) -> Result<Vec<String>, String> {
    let flag = flag.trim();
    if flag.starts_with('[') {
        serde_json::from_str(flag)
            .map_err(|e| format!("`{flag}` is not a JSON list of strings: {e}"))
    } else {
        Ok(flag
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect())
    }
}

impl CorsConfig {
    /// warp's CORS filter for this configuration.
    pub fn filter(&self) -> warp::cors::Builder {
        let any = |v: &[String]| v.is_empty() || v.iter().any(|s| s == "*");
        let mut cors = warp::cors().allow_credentials(self.credentials);
        cors = if any(&self.origins) {
            cors.allow_any_origin()
        } else {
            cors.allow_origins(self.origins.iter().map(String::as_str))
        };
        let methods: Vec<&str> = if any(&self.methods) {
            vec!["GET", "HEAD", "POST", "OPTIONS"]
        } else {
            self.methods.iter().map(String::as_str).collect()
        };
        cors = cors.allow_methods(methods);
        let headers: Vec<&str> = if any(&self.headers) {
            vec![
                "authorization",
                "content-type",
                "accept",
                "x-request-id",
                "openai-organization",
                "openai-project",
                "x-stainless-os",
                "x-stainless-lang",
                "x-stainless-package-version",
                "x-stainless-runtime",
                "x-stainless-runtime-version",
                "x-stainless-arch",
                "x-stainless-retry-count",
                "x-stainless-timeout",
            ]
        } else {
            self.headers.iter().map(String::as_str).collect()
        };
        cors.allow_headers(headers)
    }
}
