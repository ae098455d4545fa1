//! Model ids (`ModelId::new`): an accepted id is a plain file name that stays inside
//! any directory it is joined to (one normal path component, no separators, no `.` or
//! `..`, no NUL, no leading `-`), within the length bound and charset it documents,
//! and its socket name is a plain file name too. A refused id is refused for a reason
//! that holds.

use std::path::{Component, Path};

use corral_protocol::{MAX_MODEL_ID_LEN, ModelId, ModelIdError};

/// `name` joined to a root is one level below it and nowhere else.
fn stays_inside(name: &str) {
    let root = Path::new("/srv/corral/models");
    let joined = root.join(name);
    let mut parts = joined.strip_prefix(root).expect("a join stays under its root").components();
    assert!(matches!(parts.next(), Some(Component::Normal(n)) if n == name), "{name:?} is not one component");
    assert!(parts.next().is_none(), "{name:?} has more than one component");
    assert_eq!(joined.parent(), Some(root), "{name:?} leaves its root");
}

/// The fuzz target `model_id` (fuzz/targets/fuzz_targets/model_id.rs): one input.
pub fn model_id(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else { return };
    match ModelId::new(s) {
        Ok(id) => {
            let id = id.as_str();
            assert_eq!(id, s);
            assert!(!id.is_empty() && id.len() <= MAX_MODEL_ID_LEN);
            assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b)), "{id:?}");
            assert!(!id.starts_with('.') && !id.starts_with('-') && !id.contains(".."), "{id:?}");
            stays_inside(id);
            let socket = ModelId::new(s).expect("accepted once, accepted again").socket_name(u64::MAX);
            stays_inside(&socket);
        }
        Err(ModelIdError::Empty) => assert!(s.is_empty()),
        Err(ModelIdError::TooLong) => assert!(s.len() > MAX_MODEL_ID_LEN),
        Err(ModelIdError::BadChar { id, ch }) => {
            assert_eq!(id, s);
            assert!(s.contains(ch) && !(ch.is_ascii_alphanumeric() || "._:-".contains(ch)));
        }
        Err(ModelIdError::BadShape(id)) => {
            assert_eq!(id, s);
            assert!(s.starts_with('.') || s.starts_with('-') || s.contains(".."));
        }
    }
}
