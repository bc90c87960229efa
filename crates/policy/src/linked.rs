//! An insertion-ordered set of page numbers with O(1) push, remove and pop: a doubly linked
//! list threaded through a hash map (the building block of the FIFO, clock and eager lists).

use std::collections::HashMap;

#[derive(Debug, Clone, Copy)]
struct Links {
    prev: Option<u64>,
    next: Option<u64>,
}

/// Pages in the order they were pushed; every operation is O(1).
#[derive(Debug, Default, Clone)]
pub(crate) struct LinkedSet {
    links: HashMap<u64, Links>,
    head: Option<u64>,
    tail: Option<u64>,
}

impl LinkedSet {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn len(&self) -> usize {
        self.links.len()
    }

    pub(crate) fn contains(&self, page: u64) -> bool {
        self.links.contains_key(&page)
    }

    /// Appends `page` at the back; returns false (and changes nothing) if it is already there.
    pub(crate) fn push_back(&mut self, page: u64) -> bool {
        if self.links.contains_key(&page) {
            return false;
        }
        let links = Links {
            prev: self.tail,
            next: None,
        };
        if let Some(tail) = self.tail {
            if let Some(t) = self.links.get_mut(&tail) {
                t.next = Some(page);
            }
        } else {
            self.head = Some(page);
        }
        self.tail = Some(page);
        self.links.insert(page, links);
        true
    }

    /// Removes `page`; returns whether it was there.
    pub(crate) fn remove(&mut self, page: u64) -> bool {
        let Some(links) = self.links.remove(&page) else {
            return false;
        };
        match links.prev {
            Some(prev) => {
                if let Some(p) = self.links.get_mut(&prev) {
                    p.next = links.next;
                }
            }
            None => self.head = links.next,
        }
        match links.next {
            Some(next) => {
                if let Some(n) = self.links.get_mut(&next) {
                    n.prev = links.prev;
                }
            }
            None => self.tail = links.prev,
        }
        true
    }

    pub(crate) fn front(&self) -> Option<u64> {
        self.head
    }

    pub(crate) fn pop_front(&mut self) -> Option<u64> {
        let page = self.head?;
        self.remove(page);
        Some(page)
    }

    #[cfg(test)]
    pub(crate) fn to_vec(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.len());
        let mut cur = self.head;
        while let Some(p) = cur {
            out.push(p);
            cur = self.links[&p].next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_through_removals() {
        let mut s = LinkedSet::new();
        for p in [5, 1, 9, 3] {
            assert!(s.push_back(p));
        }
        assert!(!s.push_back(9), "duplicate push must be refused");
        assert!(s.remove(9));
        assert!(!s.remove(9));
        assert_eq!(s.to_vec(), vec![5, 1, 3]);
        assert!(s.remove(5));
        assert_eq!(s.front(), Some(1));
        assert!(s.remove(3));
        assert_eq!(s.to_vec(), vec![1]);
        s.push_back(7);
        assert_eq!(s.pop_front(), Some(1));
        assert_eq!(s.pop_front(), Some(7));
        assert_eq!(s.pop_front(), None);
        assert_eq!(s.len(), 0);
        assert!(!s.contains(7));
    }
}
