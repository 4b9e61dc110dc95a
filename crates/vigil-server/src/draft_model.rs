//! Loading the draft model of `--speculative draft:PATH`: a smaller model that must share the
//! target's vocabulary (its token ids are verified by the target as they are), checked at
//! start so a mismatched pair fails there instead of drafting garbage.

use crate::startup::ServeError;
use std::path::Path;
use vigil_model::load::{LoadOptions, LoadedModel};
use vigil_model::model::Model;

/// Text whose token ids two tokenizers must agree on: words, digits, punctuation, whitespace
/// runs and non-ASCII.
const PROBE: &str = "Hello, world! 1234 — naïve café 東京\n\tdef f(x):\n    return x  # done";

pub fn load(path: &Path, opts: &LoadOptions, target: &LoadedModel) -> Result<Model, ServeError> {
    let bad = |message: String| ServeError::Load {
        path: path.display().to_string(),
        message,
    };
    let draft = vigil_model::load::load(path, opts).map_err(|e| bad(e.to_string()))?;
    let (t, d) = (&target.tokenizer, &draft.tokenizer);
    if draft.model.config.vocab_size != target.model.config.vocab_size
        || d.vocab_size() != t.vocab_size()
    {
        return Err(bad(format!(
            "a draft model needs the target's vocabulary: {} tokens against the target's {}",
            d.vocab_size(),
            t.vocab_size()
        )));
    }
    let (a, b) = (t.encode(PROBE, true), d.encode(PROBE, true));
    if a.map_err(|e| bad(e.to_string()))? != b.map_err(|e| bad(e.to_string()))?
        || d.eos_token_ids() != t.eos_token_ids()
    {
        return Err(bad(
            "a draft model needs the target's vocabulary: its tokenizer splits text differently"
                .into(),
        ));
    }
    Ok(draft.model)
}
