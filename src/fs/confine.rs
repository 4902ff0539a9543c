//! A file a request names, read only from beneath a directory the operator chose (the admin
//! listener's `prefill_dir`), so no request can make the server read a file by path
//! elsewhere: `..` is refused before anything is looked up, an absolute name must be under the
//! directory as written, the name is resolved (symlinks followed) and must stay beneath the
//! directory's own resolved path, and the resolved path is opened with openat2
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, so a symlink swapped in after the check cannot
//! lead out. Only a regular file up to a size is read. Errors name what is wrong, never a
//! byte of any file.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// Reads `name` (relative to `dir`, or absolute under it) as UTF-8 text of at most
/// `max_bytes`; Err says why not, without echoing the name or any content.
pub fn read_beneath(dir: &Path, name: &str, max_bytes: u64) -> Result<String, String> {
    let (canon_dir, inside) = resolve_beneath(dir, name)?;
    let dir_fd = rustix::fs::open(
        &canon_dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("the directory: {e}"))?;
    // NONBLOCK: a FIFO cannot hang the caller (it is refused as not a regular file).
    let fd = rustix::fs::openat2(
        &dir_fd,
        &inside,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| format!("cannot open it beneath the directory: {e}"))?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > max_bytes {
        return Err(format!("longer than {max_bytes} bytes"));
    }
    let mut bytes = Vec::new();
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max_bytes {
        return Err(format!("longer than {max_bytes} bytes"));
    }
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "not UTF-8 text (byte {} is not)",
            e.utf8_error().valid_up_to()
        )
    })
}

/// `dir` resolved, and `name`'s resolved path relative to it; Err when `name` is empty, holds
/// `..` or a NUL, is absolute outside `dir`, does not exist, or resolves outside `dir`.
pub fn resolve_beneath(dir: &Path, name: &str) -> Result<(PathBuf, PathBuf), String> {
    if name.is_empty() || name.contains('\0') {
        return Err("an empty name, or a NUL byte in it".into());
    }
    let path = Path::new(name);
    if path.components().any(|c| c == Component::ParentDir) {
        return Err("'..' is not allowed in it".into());
    }
    let canon_dir = dir
        .canonicalize()
        .map_err(|e| format!("the directory {}: {e}", dir.display()))?;
    let rel = if path.is_absolute() {
        // Judged by its text first: a path elsewhere is refused without looking at it.
        path.strip_prefix(dir)
            .or_else(|_| path.strip_prefix(&canon_dir))
            .map_err(|_| format!("not under {}", dir.display()))?
    } else {
        path
    };
    let resolved = canon_dir
        .join(rel)
        .canonicalize()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("no such file under {}", dir.display()),
            _ => e.to_string(),
        })?;
    let inside = resolved
        .strip_prefix(&canon_dir)
        .map_err(|_| format!("it resolves outside {} (a symlink out)", dir.display()))?;
    if inside.as_os_str().is_empty() {
        return Err("it names the directory itself, not a file".into());
    }
    Ok((canon_dir.clone(), inside.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prefill directory holding `list.txt` and `sub/b.txt`, and a secret beside it.
    fn tree() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let top = tempfile::tempdir().unwrap();
        let dir = top.path().join("prefill");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("list.txt"), "/a\n").unwrap();
        std::fs::write(dir.join("sub/b.txt"), "/b\n").unwrap();
        let secret = top.path().join("secret");
        std::fs::write(&secret, "root:x:0:0\n").unwrap();
        (top, dir, secret)
    }

    #[test]
    fn names_beneath_the_directory_are_read() {
        let (_top, dir, _) = tree();
        assert_eq!(read_beneath(&dir, "list.txt", 100).unwrap(), "/a\n");
        assert_eq!(read_beneath(&dir, "sub/b.txt", 100).unwrap(), "/b\n");
        assert_eq!(read_beneath(&dir, "./sub//b.txt", 100).unwrap(), "/b\n");
        let abs = dir.join("sub/b.txt");
        assert_eq!(
            read_beneath(&dir, abs.to_str().unwrap(), 100).unwrap(),
            "/b\n"
        );
        // A symlink that stays inside is followed.
        std::os::unix::fs::symlink("sub/b.txt", dir.join("link")).unwrap();
        assert_eq!(read_beneath(&dir, "link", 100).unwrap(), "/b\n");
    }

    #[test]
    fn dot_dot_absolute_paths_elsewhere_and_symlinks_out_are_refused() {
        let (_top, dir, secret) = tree();
        let refused = |name: &str| read_beneath(&dir, name, 1 << 20).unwrap_err();
        assert!(refused("../secret").contains(".."));
        assert!(refused("sub/../../secret").contains(".."));
        assert!(
            refused("sub/../list.txt").contains(".."),
            "even back inside"
        );
        assert!(refused("/etc/passwd").contains("not under"));
        assert!(refused(secret.to_str().unwrap()).contains("not under"));
        std::os::unix::fs::symlink(&secret, dir.join("out")).unwrap();
        assert!(refused("out").contains("outside"));
        std::os::unix::fs::symlink("/etc", dir.join("etc")).unwrap();
        assert!(refused("etc/passwd").contains("outside"));
        assert!(refused("missing.txt").contains("no such file"));
        assert!(refused("").contains("empty"));
        assert!(refused("a\0b").contains("NUL"));
        assert!(refused(".").contains("directory itself"));
        for e in [refused("../secret"), refused("out")] {
            assert!(!e.contains("root:"), "{e}");
        }
    }

    #[test]
    fn only_regular_files_within_the_size_are_read() {
        let (_top, dir, _) = tree();
        assert!(read_beneath(&dir, "sub", 100)
            .unwrap_err()
            .contains("not a regular file"));
        let fifo = dir.join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        assert!(read_beneath(&dir, "fifo", 100)
            .unwrap_err()
            .contains("not a regular file"));
        assert!(read_beneath(&dir, "list.txt", 2)
            .unwrap_err()
            .contains("longer than 2 bytes"));
        std::fs::write(dir.join("bin"), b"/a\n\xff\n").unwrap();
        assert!(read_beneath(&dir, "bin", 100)
            .unwrap_err()
            .contains("not UTF-8"));
    }
}
