//! OpenAI-compatible server on warp and the static demo page (issue 6).
