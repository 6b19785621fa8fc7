//! The private-file rules, on real files in a temporary directory.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use super::{
    MAX_PRIVATE_FILE_BYTES, PrivateDir, PrivateFileError, create_temporary_beside,
    ensure_private_dir, read_private_file, read_private_file_into, write_private_file,
};

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// The names in `dir`.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_written_file_is_0600_in_a_0700_directory_and_leaves_nothing_beside_it() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("made").join("here");
    let path = dir.join("token");
    write_private_file(&path, b"first").unwrap();
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(read_private_file(&path).unwrap(), b"first");
    write_private_file(&path, b"second").unwrap();
    assert_eq!(read_private_file(&path).unwrap(), b"second");
    assert_eq!(names(&dir), ["token"]);
}

#[test]
fn a_link_where_the_file_goes_is_replaced_not_followed() {
    let scratch = tempfile::tempdir().unwrap();
    let target = scratch.path().join("target");
    std::fs::write(&target, "theirs").unwrap();
    let path = scratch.path().join("token");
    std::os::unix::fs::symlink(&target, &path).unwrap();
    write_private_file(&path, b"ours").unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "theirs");
    assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
    assert_eq!(read_private_file(&path).unwrap(), b"ours");
}

#[test]
fn a_temporary_is_made_beside_the_file_exclusively_with_a_random_name() {
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("store.db");
    let (one, _file) = create_temporary_beside(&path).unwrap();
    let (two, _file) = create_temporary_beside(&path).unwrap();
    assert_ne!(one, two);
    for temporary in [&one, &two] {
        assert_eq!(temporary.parent(), Some(scratch.path()));
        let name = temporary.file_name().unwrap().to_string_lossy();
        assert!(
            name.starts_with(".store.db.") && name.ends_with(".tmp"),
            "{name}"
        );
        assert_eq!(mode(temporary), 0o600);
    }
    assert!(matches!(
        create_temporary_beside(Path::new("/")),
        Err(PrivateFileError::Io { .. })
    ));
}

#[test]
fn only_a_regular_0600_file_of_this_user_is_read() {
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("key");
    write_private_file(&path, b"secret").unwrap();

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let exposed = read_private_file(&path).unwrap_err();
    assert!(matches!(
        exposed,
        PrivateFileError::Exposed { mode: 0o640, .. }
    ));
    assert!(
        exposed.to_string().contains("has mode 0640, not 0600"),
        "{exposed}"
    );
    // Refused, never fixed.
    assert_eq!(mode(&path), 0o640);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();

    let link = scratch.path().join("link");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    assert!(matches!(
        read_private_file(&link),
        Err(PrivateFileError::Link { .. })
    ));

    let dir = scratch.path().join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    let wrong = read_private_file(&dir).unwrap_err();
    assert!(
        matches!(
            wrong,
            PrivateFileError::WrongKind {
                found: "a directory",
                ..
            }
        ),
        "{wrong}"
    );

    let missing = read_private_file(&scratch.path().join("missing")).unwrap_err();
    assert!(missing.is_absent());
    assert!(!wrong.is_absent());
}

#[test]
fn a_file_larger_than_the_limit_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let path = scratch.path().join("big");
    write_private_file(&path, &[b'x'; 101]).unwrap();
    let mut bytes = b"kept".to_vec();
    let refused = read_private_file_into(&path, 100, &mut bytes).unwrap_err();
    assert!(matches!(
        refused,
        PrivateFileError::TooLarge { max: 100, .. }
    ));
    assert!(
        refused.to_string().contains("larger than 100 bytes"),
        "{refused}"
    );

    let mut bytes = b"kept".to_vec();
    read_private_file_into(&path, 101, &mut bytes).unwrap();
    assert_eq!(bytes.len(), 4 + 101);
    assert!(bytes.starts_with(b"kept"));

    let huge = usize::try_from(MAX_PRIVATE_FILE_BYTES).unwrap() + 1;
    write_private_file(&path, &vec![b'x'; huge]).unwrap();
    assert!(matches!(
        read_private_file(&path),
        Err(PrivateFileError::TooLarge { .. })
    ));
}

#[test]
fn a_private_directory_is_made_kept_or_tightened() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("data");
    assert_eq!(ensure_private_dir(&dir).unwrap(), PrivateDir::Created);
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(ensure_private_dir(&dir).unwrap(), PrivateDir::Kept);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(
        ensure_private_dir(&dir).unwrap(),
        PrivateDir::Tightened { was: 0o755 }
    );
    assert_eq!(mode(&dir), 0o700);
    let file = scratch.path().join("file");
    std::fs::write(&file, "").unwrap();
    assert!(matches!(
        ensure_private_dir(&file),
        Err(PrivateFileError::WrongKind { .. })
    ));
}
