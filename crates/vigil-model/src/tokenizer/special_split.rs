//! Cuts text at the special tokens it contains, exactly as llama.cpp's
//! `tokenizer_st_partition` does before a SentencePiece vocabulary tokenizes the rest.
//!
//! llama.cpp takes the special tokens longest first and, for each, splits every remaining text
//! fragment at each of its occurrences, left to right. So a longer token wins over a shorter one
//! wherever they overlap, which is not what a leftmost-longest automaton (HF `tokenizers`)
//! gives. Scanning the text once per special token costs too much with thousands of them
//! (Gemma 3 has 6,414), so a byte trie first finds which tokens occur at all, and only those
//! run llama.cpp's passes. A token absent from the text cannot occur in a fragment of it, so
//! the result is the same.

/// A piece of the input: text still to tokenize, or a special token's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

#[derive(Default)]
struct Node {
    /// (byte, child node), sorted by byte.
    next: Vec<(u8, u32)>,
    /// The special token (index into `tokens`) that ends here.
    token: Option<usize>,
}

pub(crate) struct SpecialSplitter {
    /// (text, id) in llama.cpp's order: longer texts first.
    tokens: Vec<(String, u32)>,
    /// Byte trie of the texts; node 0 is the root.
    trie: Vec<Node>,
}

impl SpecialSplitter {
    /// `specials`: (id, text) of every token matched whole. llama.cpp sorts them by length
    /// with `std::sort`, leaving equal lengths in no defined order; here they keep id order.
    pub(crate) fn new<'t>(specials: impl IntoIterator<Item = (u32, &'t str)>) -> Self {
        let mut tokens: Vec<(String, u32)> = (specials.into_iter())
            .filter(|(_, text)| !text.is_empty())
            .map(|(id, text)| (text.to_string(), id))
            .collect();
        tokens.sort_by_key(|(text, id)| (std::cmp::Reverse(text.len()), *id));
        let mut trie = vec![Node::default()];
        for (index, (text, _)) in tokens.iter().enumerate() {
            let mut node = 0usize;
            for &b in text.as_bytes() {
                node = match trie[node].next.binary_search_by_key(&b, |&(b, _)| b) {
                    Ok(i) => trie[node].next[i].1 as usize,
                    Err(i) => {
                        let child = trie.len();
                        trie[node].next.insert(i, (b, child as u32));
                        trie.push(Node::default());
                        child
                    }
                };
            }
            // llama.cpp refuses a vocabulary with two identical texts; keep the first anyway.
            trie[node].token.get_or_insert(index);
        }
        SpecialSplitter { tokens, trie }
    }

    /// Indices (into `tokens`, so in priority order) of the special tokens found in `text`.
    fn present(&self, text: &str) -> Vec<usize> {
        let bytes = text.as_bytes();
        let mut found = Vec::new();
        for start in 0..bytes.len() {
            let mut node = 0usize;
            for &b in &bytes[start..] {
                let next = &self.trie[node].next;
                match next.binary_search_by_key(&b, |&(b, _)| b) {
                    Ok(i) => node = next[i].1 as usize,
                    Err(_) => break,
                }
                found.extend(self.trie[node].token);
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }

    /// `text` cut into text fragments and special tokens, in order. Empty text gives nothing.
    pub(crate) fn split<'a>(&self, text: &'a str) -> Vec<Fragment<'a>> {
        let mut fragments = Vec::new();
        if !text.is_empty() {
            fragments.push(Fragment::Text(text));
        }
        for index in self.present(text) {
            let (special, id) = &self.tokens[index];
            let mut cut = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut rest) = fragment else {
                    cut.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(special.as_str()) {
                    if at > 0 {
                        cut.push(Fragment::Text(&rest[..at]));
                    }
                    cut.push(Fragment::Token(*id));
                    rest = &rest[at + special.len()..];
                }
                if !rest.is_empty() {
                    cut.push(Fragment::Text(rest));
                }
            }
            fragments = cut;
        }
        fragments
    }
}

#[cfg(test)]
mod tests {
    use super::{Fragment, SpecialSplitter};

    #[test]
    fn longer_tokens_win_wherever_they_are() {
        let s = SpecialSplitter::new([(1, "ab"), (2, "bcd"), (3, "\n"), (4, "\n\n")]);
        // Leftmost-longest would take "ab" first; llama.cpp takes the longer "bcd".
        assert_eq!(
            s.split("xabcd\n\n\ny"),
            [
                Fragment::Text("xa"),
                Fragment::Token(2),
                Fragment::Token(4),
                Fragment::Token(3),
                Fragment::Text("y"),
            ]
        );
        assert_eq!(s.split(""), []);
        assert_eq!(s.split("plain"), [Fragment::Text("plain")]);
        assert_eq!(s.split("abab"), [Fragment::Token(1), Fragment::Token(1)]);
    }
}
