//! An incremental JSON validator: it tells, one character at a time, whether the text so far can
//! still become a JSON document. The engine uses it to constrain a forced tool call's arguments:
//! a candidate token is allowed when `prefix.clone().push_str(token_text)` is not `Invalid`.
//! The state is `Copy` and a few dozen bytes, because that clone happens once per candidate.
//!
//! The grammar is RFC 8259 with serde_json's string rules (escapes, paired `\u` surrogates, no
//! raw control characters). Number magnitude is not checked: serde_json rejects finite-looking
//! literals such as `1e400`, which this accepts.

/// What the text pushed so far is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonStatus {
    /// A proper prefix of some JSON document (including the empty text).
    Incomplete,
    /// One complete value, possibly followed by whitespace. A top-level number is Complete and
    /// may still grow (`1` → `12`).
    Complete,
    /// No continuation makes it a JSON document.
    Invalid,
}

/// What the next character may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lex {
    /// A value: at the top, after `:` and after `,` in an array.
    Value,
    /// After `[`: a value or `]`.
    ValueOrClose,
    /// After `{`: a key or `}`.
    KeyOrClose,
    /// After `,` in an object.
    Key,
    Colon,
    AfterValue,
    Str {
        key: bool,
        esc: Esc,
    },
    Num(Num),
    /// `matched` leading bytes of `LITERALS[which]` seen.
    Literal {
        which: u8,
        matched: u8,
    },
    Invalid,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Esc {
    None,
    Backslash,
    /// `digits` hex digits of a `\u` escape read into `code`; `low` when it must be the low half
    /// of a surrogate pair.
    Hex {
        digits: u8,
        code: u16,
        low: bool,
    },
    /// After a high surrogate: `\u` must follow.
    PairBackslash,
    PairU,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

impl Num {
    fn can_end(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits)
    }
}

const LITERALS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// Incremental JSON validator; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonPrefix {
    lex: Lex,
    /// One bit per open container, innermost at bit `depth - 1`: set for an object.
    stack: u128,
    depth: u8,
    max_depth: u8,
}

impl Default for JsonPrefix {
    fn default() -> Self {
        Self::new()
    }
}

impl JsonPrefix {
    /// Deep enough for any tool schema, and below serde_json's recursion limit of 128.
    pub const DEFAULT_MAX_DEPTH: usize = 64;
    /// The bit stack holds this many open containers.
    pub const MAX_DEPTH: usize = 128;

    pub fn new() -> Self {
        Self::with_max_depth(Self::DEFAULT_MAX_DEPTH)
    }

    /// A validator that calls more than `max_depth` nested containers (capped at
    /// [`Self::MAX_DEPTH`]) invalid.
    pub fn with_max_depth(max_depth: usize) -> Self {
        JsonPrefix {
            lex: Lex::Value,
            stack: 0,
            depth: 0,
            max_depth: max_depth.min(Self::MAX_DEPTH) as u8,
        }
    }

    pub fn status(&self) -> JsonStatus {
        match self.lex {
            Lex::Invalid => JsonStatus::Invalid,
            Lex::AfterValue if self.depth == 0 => JsonStatus::Complete,
            Lex::Num(n) if self.depth == 0 && n.can_end() => JsonStatus::Complete,
            _ => JsonStatus::Incomplete,
        }
    }

    pub fn is_invalid(&self) -> bool {
        self.lex == Lex::Invalid
    }

    pub fn is_complete(&self) -> bool {
        self.status() == JsonStatus::Complete
    }

    pub fn push_str(&mut self, text: &str) -> JsonStatus {
        for c in text.chars() {
            if self.push(c) == JsonStatus::Invalid {
                break;
            }
        }
        self.status()
    }

    pub fn push(&mut self, c: char) -> JsonStatus {
        self.lex = self.step(c);
        self.status()
    }

    fn step(&mut self, c: char) -> Lex {
        let ws = matches!(c, ' ' | '\t' | '\n' | '\r');
        match self.lex {
            Lex::Invalid => Lex::Invalid,
            Lex::Value | Lex::ValueOrClose if ws => self.lex,
            Lex::ValueOrClose if c == ']' => self.close(false),
            Lex::Value | Lex::ValueOrClose => self.value_start(c),
            Lex::KeyOrClose | Lex::Key | Lex::Colon | Lex::AfterValue if ws => self.lex,
            Lex::KeyOrClose if c == '}' => self.close(true),
            Lex::KeyOrClose | Lex::Key if c == '"' => Lex::Str {
                key: true,
                esc: Esc::None,
            },
            Lex::Colon if c == ':' => Lex::Value,
            Lex::AfterValue if self.depth > 0 => match c {
                ',' if self.top_is_object() => Lex::Key,
                ',' => Lex::Value,
                '}' => self.close(true),
                ']' => self.close(false),
                _ => Lex::Invalid,
            },
            Lex::KeyOrClose | Lex::Key | Lex::Colon | Lex::AfterValue => Lex::Invalid,
            Lex::Str { key, esc } => string_step(key, esc, c),
            Lex::Num(n) => match number_step(n, c) {
                Some(n) => Lex::Num(n),
                None if n.can_end() => {
                    self.lex = Lex::AfterValue;
                    self.step(c)
                }
                None => Lex::Invalid,
            },
            Lex::Literal { which, matched } => {
                let word = LITERALS[which as usize];
                match word.get(matched as usize) {
                    Some(&b) if c == b as char && matched as usize + 1 == word.len() => {
                        Lex::AfterValue
                    }
                    Some(&b) if c == b as char => Lex::Literal {
                        which,
                        matched: matched + 1,
                    },
                    _ => Lex::Invalid,
                }
            }
        }
    }

    fn value_start(&mut self, c: char) -> Lex {
        match c {
            '{' => self.open(true, Lex::KeyOrClose),
            '[' => self.open(false, Lex::ValueOrClose),
            '"' => Lex::Str {
                key: false,
                esc: Esc::None,
            },
            '-' => Lex::Num(Num::Minus),
            '0' => Lex::Num(Num::Zero),
            '1'..='9' => Lex::Num(Num::Int),
            't' => Lex::Literal {
                which: 0,
                matched: 1,
            },
            'f' => Lex::Literal {
                which: 1,
                matched: 1,
            },
            'n' => Lex::Literal {
                which: 2,
                matched: 1,
            },
            _ => Lex::Invalid,
        }
    }

    fn open(&mut self, object: bool, next: Lex) -> Lex {
        if self.depth >= self.max_depth {
            return Lex::Invalid;
        }
        let bit = 1u128 << self.depth;
        self.stack = if object {
            self.stack | bit
        } else {
            self.stack & !bit
        };
        self.depth += 1;
        next
    }

    fn close(&mut self, object: bool) -> Lex {
        if self.depth == 0 || self.top_is_object() != object {
            return Lex::Invalid;
        }
        self.depth -= 1;
        Lex::AfterValue
    }

    fn top_is_object(&self) -> bool {
        self.depth > 0 && self.stack & (1u128 << (self.depth - 1)) != 0
    }
}

fn string_step(key: bool, esc: Esc, c: char) -> Lex {
    let next = |esc| Lex::Str { key, esc };
    match esc {
        Esc::None => match c {
            '"' if key => Lex::Colon,
            '"' => Lex::AfterValue,
            '\\' => next(Esc::Backslash),
            '\u{0}'..='\u{1f}' => Lex::Invalid,
            _ => next(Esc::None),
        },
        Esc::Backslash => match c {
            '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' => next(Esc::None),
            'u' => next(Esc::Hex {
                digits: 0,
                code: 0,
                low: false,
            }),
            _ => Lex::Invalid,
        },
        Esc::Hex { digits, code, low } => {
            let Some(d) = c.to_digit(16) else {
                return Lex::Invalid;
            };
            let code = code << 4 | d as u16;
            if digits < 3 {
                return next(Esc::Hex {
                    digits: digits + 1,
                    code,
                    low,
                });
            }
            match (low, code) {
                (false, 0xD800..=0xDBFF) => next(Esc::PairBackslash),
                (false, 0xDC00..=0xDFFF) => Lex::Invalid,
                (false, _) | (true, 0xDC00..=0xDFFF) => next(Esc::None),
                (true, _) => Lex::Invalid,
            }
        }
        Esc::PairBackslash if c == '\\' => next(Esc::PairU),
        Esc::PairU if c == 'u' => next(Esc::Hex {
            digits: 0,
            code: 0,
            low: true,
        }),
        Esc::PairBackslash | Esc::PairU => Lex::Invalid,
    }
}

/// The number state after `c`, or `None` when `c` cannot continue the number.
fn number_step(n: Num, c: char) -> Option<Num> {
    let digit = c.is_ascii_digit();
    let exp = c == 'e' || c == 'E';
    Some(match n {
        Num::Minus if c == '0' => Num::Zero,
        Num::Minus if digit => Num::Int,
        Num::Int if digit => Num::Int,
        Num::Zero | Num::Int if c == '.' => Num::Dot,
        Num::Dot | Num::Frac if digit => Num::Frac,
        Num::Zero | Num::Int | Num::Frac if exp => Num::Exp,
        Num::Exp if c == '+' || c == '-' => Num::ExpSign,
        Num::Exp | Num::ExpSign | Num::ExpDigits if digit => Num::ExpDigits,
        _ => return None,
    })
}
