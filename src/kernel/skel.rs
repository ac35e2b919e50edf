//! [`Owned`]: a loaded libbpf-rs skeleton that owns the object storage it borrows, so that a
//! BPF object can live in a struct (`Ops`, `BpfSyscalls`) and be sent to another thread. The
//! one place with the `Box::into_raw` / manual `Drop` / `unsafe impl Send` this needs.

use std::mem::{ManuallyDrop, MaybeUninit};
use std::ops::{Deref, DerefMut};

use libbpf_rs::OpenObject;

use crate::Result;

/// A loaded skeleton `S` (with whatever it keeps beside it, such as links) and the storage it
/// borrows. Dropping it drops `S` first (unloading the programs), then the storage.
pub(crate) struct Owned<S> {
    skel: ManuallyDrop<S>,
    storage: *mut MaybeUninit<OpenObject>,
}

// SAFETY: the generated skeletons are Send; `storage` is owned exclusively by this value, and
// only `skel` borrows it.
unsafe impl<S: Send> Send for Owned<S> {}

impl<S> Owned<S> {
    /// Opens and loads a skeleton with `load`, which gets storage that lives as long as the
    /// returned value.
    pub fn load(load: impl FnOnce(&'static mut MaybeUninit<OpenObject>) -> Result<S>) -> Result<Self> {
        let storage = Box::into_raw(Box::new(MaybeUninit::<OpenObject>::uninit()));
        // SAFETY: storage stays allocated until Drop, after the skeleton that borrows it.
        let storage_ref: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *storage };
        match load(storage_ref) {
            Ok(skel) => Ok(Owned {
                skel: ManuallyDrop::new(skel),
                storage,
            }),
            Err(e) => {
                // SAFETY: nothing borrows storage any more (the failed load dropped its borrow).
                drop(unsafe { Box::from_raw(storage) });
                Err(e)
            }
        }
    }
}

impl<S> Deref for Owned<S> {
    type Target = S;
    fn deref(&self) -> &S {
        &self.skel
    }
}

impl<S> DerefMut for Owned<S> {
    fn deref_mut(&mut self) -> &mut S {
        &mut self.skel
    }
}

impl<S> Drop for Owned<S> {
    fn drop(&mut self) {
        // SAFETY: the skeleton borrows *storage, so it goes first; storage came from
        // Box::into_raw and is dropped once.
        unsafe {
            ManuallyDrop::drop(&mut self.skel);
            drop(Box::from_raw(self.storage));
        }
    }
}
