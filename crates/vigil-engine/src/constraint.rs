//! Constrained decoding: a per-sequence rule on which token may come next, applied as a logits
//! mask before sampling. `ForcedToolCall` makes a forced tool call well-formed: the function
//! name is one of the offered tools, and the arguments are one JSON object, after which the
//! sequence ends.

use std::sync::Arc;
use vigil_model::json_prefix::{JsonPrefix, JsonStatus};

pub trait TokenConstraint: Send {
    /// Whether `token` may come next.
    fn allows(&self, token: u32) -> bool;
    /// Masks `logits` in place to the tokens that may come next; returns how many may. When
    /// none may, the logits are left as they are (the caller ends the sequence). By default,
    /// token by token through `allows`; a constraint that computes whole masks (a grammar)
    /// overrides it.
    fn mask(&mut self, logits: &mut [f32]) -> usize {
        let allowed: Vec<bool> = (0..logits.len()).map(|id| self.allows(id as u32)).collect();
        let n = allowed.iter().filter(|&&a| a).count();
        if n > 0 {
            for (l, ok) in logits.iter_mut().zip(allowed) {
                if !ok {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        n
    }
    /// Record that `token` was sampled.
    fn advance(&mut self, token: u32);
    /// The constrained text is finished: the sequence stops here.
    fn is_complete(&self) -> bool;
}

/// The text each token id decodes to on its own (shared by every constrained sequence).
pub type TokenTexts = Arc<Vec<String>>;

/// The output after a forced call's opening: `[NAME<between>]` then a JSON object.
/// `names` holds, per offered tool, the literal the output must start with (the name and what
/// follows it up to the arguments, e.g. `get_weather", "arguments": `); empty when the prompt
/// already named the function.
#[derive(Clone)]
pub struct ForcedToolCall {
    texts: TokenTexts,
    literals: Vec<String>,
    /// Literal text produced so far (while choosing the name).
    head: String,
    /// `Some` once a literal is complete.
    json: Option<JsonPrefix>,
    /// Whether the object's `{` has been seen (whitespace may precede it).
    opened: bool,
    /// The last character produced: runs of whitespace are refused, because a small model
    /// would otherwise spend its whole budget on blank JSON padding.
    last_char: Option<char>,
}

impl ForcedToolCall {
    pub fn new(texts: TokenTexts, literals: Vec<String>) -> Self {
        let json = literals.is_empty().then(JsonPrefix::new);
        ForcedToolCall {
            texts,
            literals,
            head: String::new(),
            json,
            opened: false,
            last_char: None,
        }
    }

    fn doubles_whitespace(&self, text: &str) -> bool {
        let mut prev = self.last_char;
        for c in text.chars() {
            if c.is_whitespace() && prev.is_none_or(char::is_whitespace) {
                return true;
            }
            prev = Some(c);
        }
        false
    }

    /// The state after appending `text`, or `None` if that breaks the form.
    fn after(&self, text: &str) -> Option<(String, Option<JsonPrefix>, bool)> {
        if text.is_empty() {
            return None;
        }
        let (mut head, mut json, mut opened) = (self.head.clone(), self.json, self.opened);
        let mut rest = text;
        if json.is_none() {
            head.push_str(text);
            match self.literals.iter().find(|l| head.starts_with(l.as_str())) {
                Some(l) => {
                    rest = &head[l.len()..];
                    let rest_owned = rest.to_string();
                    json = Some(JsonPrefix::new());
                    return Self::feed_json(json, opened, &rest_owned)
                        .map(|(j, o)| (head.clone(), j, o));
                }
                None => {
                    return self
                        .literals
                        .iter()
                        .any(|l| l.starts_with(head.as_str()))
                        .then_some((head, None, opened));
                }
            }
        }
        let (j, o) = Self::feed_json(json, opened, rest)?;
        json = j;
        opened = o;
        Some((head, json, opened))
    }

    fn feed_json(
        json: Option<JsonPrefix>,
        mut opened: bool,
        text: &str,
    ) -> Option<(Option<JsonPrefix>, bool)> {
        let mut j = json?;
        if j.status() == JsonStatus::Complete && !text.is_empty() {
            return None;
        }
        for c in text.chars() {
            if !opened {
                if c.is_whitespace() {
                    continue;
                }
                if c != '{' {
                    return None;
                }
                opened = true;
            }
            if j.status() == JsonStatus::Complete {
                return None;
            }
            if j.push(c) == JsonStatus::Invalid {
                return None;
            }
        }
        Some((Some(j), opened))
    }
}

impl TokenConstraint for ForcedToolCall {
    fn allows(&self, token: u32) -> bool {
        let Some(text) = self.texts.get(token as usize) else {
            return false;
        };
        // A lone piece of a multi-byte character cannot be checked; refuse it.
        if text.contains('\u{FFFD}') || self.doubles_whitespace(text) {
            return false;
        }
        self.after(text).is_some()
    }

    fn advance(&mut self, token: u32) {
        let text = self.texts.get(token as usize).cloned().unwrap_or_default();
        if let Some((head, json, opened)) = self.after(&text) {
            self.head = head;
            self.json = json;
            self.opened = opened;
        }
        if let Some(c) = text.chars().last() {
            self.last_char = Some(c);
        }
    }

    fn is_complete(&self) -> bool {
        self.json
            .is_some_and(|j| j.status() == JsonStatus::Complete)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(words: &[&str]) -> TokenTexts {
        Arc::new(words.iter().map(|s| s.to_string()).collect())
    }

    fn run(c: &mut ForcedToolCall, tokens: &[u32]) -> bool {
        for &t in tokens {
            if !c.allows(t) {
                return false;
            }
            c.advance(t);
        }
        true
    }

    #[test]
    fn named_call_takes_one_object_then_completes() {
        let t = texts(&["{", "\"city\"", ":", " \"Paris\"", "}", "x", " ", "[1]"]);
        let mut c = ForcedToolCall::new(t, Vec::new());
        assert!(!c.allows(5), "text before the object");
        assert!(!c.allows(7), "an array is not an arguments object");
        assert!(
            !c.allows(6),
            "no leading whitespace: the prompt already ends with one"
        );
        assert!(run(&mut c, &[0, 1, 2]));
        let mut spaced = c.clone();
        assert!(run(&mut spaced, &[6]));
        assert!(
            !spaced.allows(6) && !spaced.allows(3),
            "no runs of whitespace"
        );
        assert!(run(&mut c, &[3]));
        assert!(!c.is_complete());
        assert!(!c.allows(5));
        assert!(run(&mut c, &[4]));
        assert!(c.is_complete());
        assert!(!c.allows(4), "nothing after the object");
    }

    #[test]
    fn required_call_chooses_among_the_offered_names() {
        let lit = |n: &str| format!("{n}\", \"arguments\": ");
        let t = texts(&[
            "get",
            "_weather",
            "_time",
            "\", \"arguments\": {",
            "}",
            "_news",
            "\", \"arguments\": ",
        ]);
        let mut c = ForcedToolCall::new(t, vec![lit("get_weather"), lit("get_time")]);
        assert!(c.allows(0));
        assert!(run(&mut c, &[0]));
        assert!(!c.allows(5), "get_news is not offered");
        assert!(
            run(&mut c, &[1, 3]),
            "a token may span the literal and the object"
        );
        assert!(run(&mut c, &[4]));
        assert!(c.is_complete());
    }

    #[test]
    fn mask_leaves_only_allowed_tokens() {
        let t = texts(&["{", "a", "}"]);
        let mut c = ForcedToolCall::new(t, Vec::new());
        let mut logits = vec![1.0, 2.0, 3.0];
        assert_eq!(c.mask(&mut logits), 1);
        let mut done = c.clone();
        done.advance(0);
        done.advance(2);
        let mut untouched = vec![1.0, 2.0, 3.0];
        assert_eq!(done.mask(&mut untouched), 0);
        assert_eq!(untouched, vec![1.0, 2.0, 3.0]);
        assert_eq!(logits[0], 1.0);
        assert!(logits[1].is_infinite() && logits[2].is_infinite());
    }
}
