use slab::Slab;

/// Buffers frames for multiple streams.
#[derive(Debug)]
pub struct Buffer<T> {
    slab: Slab<Slot<T>>,
}

/// A sequence of frames in a `Buffer`
#[derive(Debug)]
pub struct Deque {
    indices: Option<Indices>,
}

/// Tracks the head & tail for a sequence of frames in a `Buffer`.
#[derive(Debug, Default, Copy, Clone)]
struct Indices {
    head: usize,
    tail: usize,
}

#[derive(Debug)]
struct Slot<T> {
    value: T,
    next: Option<usize>,
}

impl<T> Buffer<T> {
    pub fn new() -> Self {
        Buffer { slab: Slab::new() }
    }

    pub fn is_empty(&self) -> bool {
        self.slab.is_empty()
    }
}

impl Deque {
    pub fn new() -> Self {
        Deque { indices: None }
    }

    pub fn is_empty(&self) -> bool {
        self.indices.is_none()
    }

    pub fn push_back<T>(&mut self, buf: &mut Buffer<T>, value: T) {
        let key = buf.slab.insert(Slot { value, next: None });

        match self.indices {
            Some(ref mut idxs) => {
                buf.slab[idxs.tail].next = Some(key);
                idxs.tail = key;
            }
            None => {
                self.indices = Some(Indices {
                    head: key,
                    tail: key,
                });
            }
        }
    }

    pub fn push_front<T>(&mut self, buf: &mut Buffer<T>, value: T) {
        let key = buf.slab.insert(Slot { value, next: None });

        match self.indices {
            Some(ref mut idxs) => {
                buf.slab[key].next = Some(idxs.head);
                idxs.head = key;
            }
            None => {
                self.indices = Some(Indices {
                    head: key,
                    tail: key,
                });
            }
        }
    }

    pub fn pop_front<T>(&mut self, buf: &mut Buffer<T>) -> Option<T> {
        match self.indices {
            Some(mut idxs) => {
                let mut slot = buf.slab.remove(idxs.head);
                // lksadmin patch: a connection's frame buffer grows to the
                // most frames ever queued at once and kept that storage for
                // the connection's life; give it back once the last frame
                // of every stream is out. No key is outstanding then.
                if buf.slab.is_empty() && buf.slab.capacity() > 0 {
                    buf.slab = Slab::new();
                }

                if idxs.head == idxs.tail {
                    assert!(slot.next.is_none());
                    self.indices = None;
                } else {
                    idxs.head = slot.next.take().unwrap();
                    self.indices = Some(idxs);
                }

                Some(slot.value)
            }
            None => None,
        }
    }
}

/// lksadmin patch: an emptied buffer holds no storage; frames still come out
/// in order per deque, interleaved or not.
#[cfg(test)]
mod lksadmin_patch_tests {
    use super::*;

    #[test]
    fn storage_is_given_back_when_the_last_frame_is_out() {
        let mut buf = Buffer::new();
        let (mut a, mut b) = (Deque::new(), Deque::new());
        for round in 0..3u32 {
            for i in 0..10 {
                a.push_back(&mut buf, (round, 'a', i));
                b.push_back(&mut buf, (round, 'b', i));
            }
            b.push_front(&mut buf, (round, 'b', 99));
            assert!(buf.slab.capacity() >= 21);
            for i in 0..10 {
                assert_eq!(a.pop_front(&mut buf), Some((round, 'a', i)));
            }
            assert!(a.is_empty());
            assert!(buf.slab.capacity() >= 11, "b's frames are still held");
            assert_eq!(b.pop_front(&mut buf), Some((round, 'b', 99)));
            for i in 0..10 {
                assert_eq!(b.pop_front(&mut buf), Some((round, 'b', i)));
            }
            assert_eq!(b.pop_front(&mut buf), None);
            assert!(buf.is_empty());
            assert_eq!(buf.slab.capacity(), 0);
        }
    }
}
