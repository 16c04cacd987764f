//! Serialized forms of a read-view entry, made by a surface the first time it lists the entry
//! and shared by every clone of it. An entry is immutable: a change to its record makes a new
//! entry with empty forms, so a form can never show an older revision than its entry's.

use std::ops::Range;
use std::sync::OnceLock;

use bytes::Bytes;

/// Which rendering a form slot holds. The dispatcher does not know the formats; it only keeps
/// one slot per surface listing so that a list of 50,000 does not serialize 50,000 objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// The Kubernetes facade's `Sandbox` object.
    KubeObject,
    /// The Kubernetes facade's Table row (less what changes with the clock).
    KubeRow,
    /// The e2b surface's listed sandbox.
    E2bListed,
}

const FORMS: usize = 3;

impl Form {
    fn slot(self) -> usize {
        match self {
            Form::KubeObject => 0,
            Form::KubeRow => 1,
            Form::E2bListed => 2,
        }
    }
}

/// One serialized form: the bytes, and a span in them that the surface marks (the facade marks
/// where a Table row's age goes).
#[derive(Debug, Clone)]
pub struct Rendered {
    pub bytes: Bytes,
    pub mark: Range<usize>,
}

/// Bytes to keep in a form: shrunk to their length first, since a serializer's buffer grows
/// by doubling and a form lives as long as its entry (50,000 of them would otherwise hold up to
/// twice their size).
pub fn kept(bytes: Vec<u8>) -> Bytes {
    Bytes::from(bytes.into_boxed_slice())
}

/// The form slots of one entry, each filled at most once.
#[derive(Debug, Default)]
pub struct Forms {
    slots: [OnceLock<Rendered>; FORMS],
}

impl Forms {
    /// The form, rendered by `render` on first use. Concurrent first uses may both render;
    /// one result is kept, and both are equal since an entry never changes.
    pub fn get_or_render(&self, form: Form, render: impl FnOnce() -> Rendered) -> &Rendered {
        self.slots[form.slot()].get_or_init(render)
    }

    /// The form if it was rendered already.
    pub fn get(&self, form: Form) -> Option<&Rendered> {
        self.slots[form.slot()].get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_is_rendered_once_per_slot() {
        let forms = Forms::default();
        let mut calls = 0;
        let first = forms
            .get_or_render(Form::KubeObject, || {
                calls += 1;
                Rendered {
                    bytes: Bytes::from_static(b"{\"m\":1}"),
                    mark: 5..6,
                }
            })
            .clone();
        let again = forms.get_or_render(Form::KubeObject, || unreachable!("rendered already"));
        assert_eq!(calls, 1);
        assert_eq!(again.bytes, first.bytes);
        assert_eq!(again.mark, 5..6);
        assert!(forms.get(Form::E2bListed).is_none(), "slots are separate");
        assert!(forms.get(Form::KubeRow).is_none(), "slots are separate");
        let mut grown = Vec::with_capacity(4096);
        grown.extend_from_slice(b"abc");
        assert_eq!(kept(grown), Bytes::from_static(b"abc"));
    }
}
