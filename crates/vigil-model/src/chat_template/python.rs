//! Python's view of template values, where chat templates can see the difference from
//! minijinja's: `json.dumps` (the `tojson` filter), `str()` of printed values (`None`, `True`,
//! lists and dicts as Python reprs), float reprs, and `strftime`.

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Output, State, Value};

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.into())
}

/// The template output formatter: prints values as Jinja2 does, i.e. with Python's `str()`.
pub(super) fn format_value(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Seq | ValueKind::Map if !value.is_safe() => {
            let text = python_str(value)?;
            out.write_str(&text).map_err(Error::from)
        }
        ValueKind::Number if !value.is_integer() => {
            let text = python_str(value)?;
            out.write_str(&text).map_err(Error::from)
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// Python's `str(value)`: strings as they are, everything else as its repr.
fn python_str(value: &Value) -> Result<String, Error> {
    match value.as_str() {
        Some(s) if value.kind() == ValueKind::String => Ok(s.to_string()),
        _ => {
            let mut s = String::new();
            python_repr(value, &mut s)?;
            Ok(s)
        }
    }
}

fn python_repr(value: &Value, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number(value)?),
        ValueKind::String => repr_str(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(&item, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                python_repr(&key, out)?;
                out.push_str(": ");
                python_repr(&value.get_item(&key)?, out)?;
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
    Ok(())
}

fn repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// An integer as its digits, a float as Python's `repr(float)`.
fn number(value: &Value) -> Result<String, Error> {
    if value.is_integer() {
        return Ok(value.to_string());
    }
    let f = f64::try_from(value.clone())?;
    Ok(float_repr(f))
}

/// Python's `repr(f)`: shortest round-trip digits, positional for exponents in [-4, 16),
/// scientific (`1e-05`, `1.5e+16`) otherwise.
fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

/// The arguments of `json.dumps` that `tojson` exposes.
pub(super) struct JsonOptions {
    ensure_ascii: bool,
    /// `None`: everything on one line.
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

impl JsonOptions {
    pub fn new(
        ensure_ascii: bool,
        indent: Option<Value>,
        separators: Option<Value>,
        sort_keys: bool,
    ) -> Result<Self, Error> {
        let indent = match indent {
            None => None,
            Some(v) if v.is_integer() => {
                let n = i64::try_from(v)?;
                Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
            }
            Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
            Some(v) => {
                return Err(invalid(format!(
                    "tojson: indent must be an int or string, got {v}"
                )))
            }
        };
        let (item_separator, key_separator) = match separators {
            // json.dumps drops the space after ',' when indenting, as lines end there.
            None if indent.is_some() => (",".to_string(), ": ".to_string()),
            None => (", ".to_string(), ": ".to_string()),
            Some(seps) => {
                let parts: Vec<Value> = seps.try_iter()?.collect();
                match parts.as_slice() {
                    [a, b] => (
                        a.as_str()
                            .ok_or_else(|| invalid("tojson: separators must be strings"))?
                            .to_string(),
                        b.as_str()
                            .ok_or_else(|| invalid("tojson: separators must be strings"))?
                            .to_string(),
                    ),
                    _ => return Err(invalid("tojson: separators must be a pair of strings")),
                }
            }
        };
        Ok(JsonOptions {
            ensure_ascii,
            indent,
            item_separator,
            key_separator,
            sort_keys,
        })
    }
}

/// `json.dumps(value, **options)`.
pub(super) fn json_dumps(value: &Value, options: &JsonOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_json(value, options, 0, &mut out)?;
    Ok(out)
}

fn newline_indent(options: &JsonOptions, level: usize, out: &mut String) {
    if let Some(indent) = &options.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn write_json(
    value: &Value,
    options: &JsonOptions,
    level: usize,
    out: &mut String,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(value)?),
        ValueKind::String => json_str(
            value.as_str().unwrap_or_default(),
            options.ensure_ascii,
            out,
        ),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_separator);
                }
                newline_indent(options, level + 1, out);
                write_json(item, options, level + 1, out)?;
            }
            newline_indent(options, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if options.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_separator);
                }
                newline_indent(options, level + 1, out);
                json_str(key, options.ensure_ascii, out);
                out.push_str(&options.key_separator);
                write_json(item, options, level + 1, out)?;
            }
            newline_indent(options, level, out);
            out.push('}');
        }
        _ => return Err(invalid(format!("tojson: {value} is not JSON serializable"))),
    }
    Ok(())
}

/// Dict keys as json.dumps writes them: strings as-is, numbers and constants as their JSON.
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Number => number(key),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::None => Ok("null".into()),
        _ => Err(invalid(format!(
            "tojson: keys must be str, int, float, bool or None, not {key}"
        ))),
    }
}

fn json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

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
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
pub fn civil_from_days(days: i64) -> (i64, usize, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month as usize, day)
}

/// Python's `strftime` for the directives chat templates use, at `unix_secs` (UTC).
pub(super) fn strftime(unix_secs: u64, format: &str) -> Result<String, Error> {
    let secs = i64::try_from(unix_secs).map_err(|_| invalid("strftime_now: time out of range"))?;
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let month_name = MONTHS.get(month.wrapping_sub(1)).copied().unwrap_or("");
    // 1970-01-01 was a Thursday.
    let weekday = WEEKDAYS
        .get((days + 3).rem_euclid(7) as usize)
        .copied()
        .unwrap_or("");
    let day_of_year = days - {
        let mut d = days;
        while civil_from_days(d - 1).0 == year {
            d -= 1;
        }
        d
    } + 1;
    let (hour, minute, second) = (tod / 3600, tod / 60 % 60, tod % 60);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('-') if chars.clone().next() == Some('d') => {
                chars.next();
                out.push_str(&day.to_string());
            }
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(month_name.get(..3).unwrap_or("")),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(weekday.get(..3).unwrap_or("")),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('F') => out.push_str(&format!("{year}-{month:02}-{day:02}")),
            Some('%') => out.push('%'),
            Some(other) => {
                return Err(invalid(format!(
                    "strftime_now: unsupported directive %{other}"
                )))
            }
            None => out.push('%'),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (-2.5, "-2.5"),
            (1.5e300, "1.5e+300"),
        ] {
            assert_eq!(float_repr(f), want);
        }
    }

    #[test]
    fn strftime_known_date() {
        // 2024-07-26 12:34:56 UTC, a Friday, day 208.
        let t = 1_721_997_296;
        assert_eq!(strftime(t, "%d %b %Y").unwrap(), "26 Jul 2024");
        assert_eq!(
            strftime(t, "%A %B %-d %H:%M:%S %j").unwrap(),
            "Friday July 26 12:34:56 208"
        );
    }
}
