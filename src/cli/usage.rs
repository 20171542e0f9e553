//! The usage error (exit code 2) and the checks of the files a command
//! names: prompt and text files read within a cap, outputs that would
//! replace an input. A leaf of cli/: the flag checks (checks.rs) and every
//! command's group use it; it uses none of them.

use std::path::Path;

/// Bad flags or flag combinations found after parsing (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The input `out` is, when it is one of `inputs`: the same file (device
/// and inode, symlinks followed, so a hard link or a symlink to an input
/// is that input). An `out` that does not exist yet is none of them.
fn input_named_by<'a>(out: &Path, inputs: &[&'a Path]) -> Option<&'a Path> {
    use std::os::unix::fs::MetadataExt;
    let o = std::fs::metadata(out).ok()?;
    inputs
        .iter()
        .copied()
        .find(|i| std::fs::metadata(i).is_ok_and(|m| (m.dev(), m.ino()) == (o.dev(), o.ino())))
}

/// The most prompt bytes bmoe reads (far beyond any context bmoe can hold).
const MAX_PROMPT_BYTES: u64 = 16 * 1024 * 1024;

/// Read the prompt from a regular file, or from stdin for `-`, at most
/// `MAX_PROMPT_BYTES` (a FIFO, a device or /dev/zero would block or never end).
pub fn read_prompt_file(f: &Path) -> Result<String, UsageError> {
    use std::io::Read;
    if f != Path::new("-") {
        return read_text_file("the prompt file", f, ", or -f - to read stdin");
    }
    let mut bytes = Vec::new();
    std::io::stdin()
        .take(MAX_PROMPT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| UsageError(format!("reading the prompt from stdin: {e}")))?;
    utf8_within_cap("the prompt on stdin", bytes)
}

/// `bytes` as text, refused when over the cap or not UTF-8.
fn utf8_within_cap(what: &str, bytes: Vec<u8>) -> Result<String, UsageError> {
    if bytes.len() as u64 > MAX_PROMPT_BYTES {
        return Err(UsageError(format!(
            "{what} is over {} MiB: bmoe reads at most that much",
            MAX_PROMPT_BYTES >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|e| UsageError(format!("{what} is not UTF-8 text ({e})")))
}

/// Read a text file given on the command line (a prompt, a cells file), at
/// most `MAX_PROMPT_BYTES`: a missing file, a directory, a FIFO or a device (never
/// opened, so never blocks), an oversized or non-UTF-8 file is refused with the
/// fix; `hint` ends the not-a-regular-file message.
pub fn read_text_file(what: &str, f: &Path, hint: &str) -> Result<String, UsageError> {
    use std::io::Read;
    let name = f.display();
    let meta = std::fs::metadata(f).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => UsageError(format!("{what} {name} does not exist")),
        _ => UsageError(format!("{what} {name}: {e}")),
    })?;
    if meta.is_dir() {
        return Err(UsageError(format!(
            "{what} {name} is a directory: give a text file"
        )));
    }
    if !meta.is_file() {
        return Err(UsageError(format!(
            "{what} {name} is not a regular file (a FIFO or a device): give a text file{hint}"
        )));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(f)
        .and_then(|h| h.take(MAX_PROMPT_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| UsageError(format!("reading {what} {name}: {e}")))?;
    utf8_within_cap(&format!("{what} {name}"), bytes)
}

/// The one check of every file a command writes at a path the user named
/// (run's `--csv`, `--route-trace` and `--cache-warm` profile, the global
/// `--trace-chrome`, chat's `/save`, `trace import -o`, `fixture ... -o`,
/// the files `bench` writes in its `-o` directory; a new output flag calls it
/// too), before any work: refused (exit 2) when `out` is one of the
/// command's `inputs` (see [`input_named_by`]: it would be replaced, also
/// through a symlink or a hard link), or exists as something other than a
/// regular file (a directory, a FIFO that would block, a device). Output
/// files are written beside their target and renamed over it
/// (`bmoe_output`), so this is the only place a path is judged.
pub fn output_file(flag: &str, out: &Path, inputs: &[&Path]) -> Result<(), UsageError> {
    let name = out.display();
    if let Some(input) = input_named_by(out, inputs) {
        return Err(UsageError(format!(
            "{flag} {name} is the command's own input {}: it would be overwritten; choose \
             another path for {flag}",
            input.display()
        )));
    }
    match std::fs::metadata(out) {
        Ok(m) if m.is_dir() => Err(UsageError(format!(
            "{flag} {name} is a directory: give a file path"
        ))),
        Ok(m) if !m.is_file() => Err(UsageError(format!(
            "{flag} {name} exists and is not a regular file (a FIFO or a device): choose a \
             file path"
        ))),
        _ => Ok(()),
    }
}

/// `bench -o`: a new or empty directory, or one without an earlier bench's
/// results (its runs would mix with this one's in the summary).
pub fn bench_out_dir(out: &Path) -> Result<(), UsageError> {
    let name = out.display();
    match std::fs::metadata(out) {
        Err(_) => Ok(()),
        Ok(m) if !m.is_dir() => Err(UsageError(format!(
            "-o {name} is not a directory: give a directory for the bench's results (created if \
             missing)"
        ))),
        Ok(_) if out.join("summary.md").exists() || out.join("runs").exists() => {
            Err(UsageError(format!(
                "-o {name} already holds a bench's results (summary.md, runs/): give a new \
                 directory, or remove that one, so two benches' runs are not mixed"
            )))
        }
        Ok(_) => Ok(()),
    }
}

/// A prompt bmoe can use: not empty, and without a NUL byte under `--chat`
/// (the chat template takes C strings).
pub fn prompt_text(prompt: &str, chat: bool) -> Result<(), UsageError> {
    if prompt.is_empty() {
        return Err(UsageError(
            "the prompt is empty: give some text with -p or -f".into(),
        ));
    }
    if chat && prompt.contains('\0') {
        return Err(UsageError(
            "the prompt holds a NUL byte, which a chat template cannot carry: remove it, or drop \
             --chat"
                .into(),
        ));
    }
    Ok(())
}
