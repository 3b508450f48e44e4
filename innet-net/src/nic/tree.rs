//! The shape of a NIC-triggered reduction tree (the NIC paper): members `0..n` in a k-ary heap
//! order. Member 0 is the root; member `i > 0` sends its partial result to `(i - 1) / k`;
//! its children are `k·i + 1 ..= k·i + k`. Every member, library and daemon alike, derives
//! its neighbours from the member list and the branch degree alone.

use std::{net::Ipv4Addr, ops::Range};

use innet_common::group::MAX_CHILDREN;

/// Why a tree cannot be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("a branch degree of {0} is outside 1..={max}: a NIC holds up to {max} children", max = MAX_CHILDREN)]
    Degree(usize),
    #[error("a reduction tree needs two or more members (got {0})")]
    TooSmall(usize),
    #[error("member {me} is outside a tree of {n} members")]
    NotAMember { me: usize, n: usize },
}

/// A k-ary reduction tree over `n` members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tree {
    pub n: usize,
    pub degree: usize,
}

impl Tree {
    /// # Errors
    /// A degree outside `1..=MAX_CHILDREN`, or fewer than two members.
    pub fn new(n: usize, degree: usize) -> Result<Self, TreeError> {
        if degree == 0 || degree > MAX_CHILDREN {
            return Err(TreeError::Degree(degree));
        }
        if n < 2 {
            return Err(TreeError::TooSmall(n));
        }
        Ok(Self { n, degree })
    }

    /// The library's choice for `n` members: the degree that gives the shallowest tree whose
    /// root does not take more children than the others, ⌈√(n−1)⌉ (two levels for up to
    /// 257 members), at least 2 and at most what a NIC holds.
    #[must_use]
    pub fn default_degree(n: usize) -> usize {
        let mut k = 1;
        while k * k < n.saturating_sub(1) {
            k += 1;
        }
        k.clamp(2, MAX_CHILDREN)
    }

    /// The parent of member `i` (`None` for the root).
    #[must_use]
    pub fn parent(&self, i: usize) -> Option<usize> {
        (i > 0).then(|| (i - 1) / self.degree)
    }

    /// The children of member `i`.
    #[must_use]
    pub fn children(&self, i: usize) -> Range<usize> {
        let first = (self.degree * i + 1).min(self.n);
        first..(first + self.degree).min(self.n)
    }

    /// Levels below the root (hops a leaf's contribution travels up).
    #[must_use]
    pub fn depth(&self) -> usize {
        let mut d = 0;
        let mut i = self.n - 1;
        while let Some(p) = self.parent(i) {
            i = p;
            d += 1;
        }
        d
    }

    /// # Errors
    /// `me` outside the tree.
    pub fn check_member(&self, me: usize) -> Result<(), TreeError> {
        if me < self.n {
            Ok(())
        } else {
            Err(TreeError::NotAMember { me, n: self.n })
        }
    }
}

/// The multicast address a group's results go to: 239.x.y.z (administratively scoped) with
/// the 24-bit wire id in x.y.z, and its Ethernet MAC (RFC 1112: 01:00:5e + low 23 bits).
#[must_use]
pub fn result_address(wire_id: u32) -> (Ipv4Addr, [u8; 6]) {
    let [_, x, y, z] = wire_id.to_be_bytes();
    (
        Ipv4Addr::new(239, x, y, z),
        [0x01, 0x00, 0x5e, x & 0x7f, y, z],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_member_but_the_root_has_one_parent_that_lists_it() {
        for n in 2..40 {
            for degree in 1..=MAX_CHILDREN {
                let t = Tree::new(n, degree).unwrap();
                assert_eq!(t.parent(0), None);
                let mut seen = vec![0; n];
                for i in 0..n {
                    for c in t.children(i) {
                        assert_eq!(t.parent(c), Some(i), "n={n} k={degree}");
                        seen[c] += 1;
                    }
                    assert!(t.children(i).len() <= degree);
                }
                assert_eq!(seen[0], 0);
                assert!(seen[1..].iter().all(|&s| s == 1), "n={n} k={degree}");
            }
        }
    }

    #[test]
    fn sixteen_members_at_degrees_two_four_and_fifteen() {
        let t = Tree::new(16, 2).unwrap();
        assert_eq!((t.children(0), t.children(7), t.depth()), (1..3, 15..16, 4));
        let t = Tree::new(16, 4).unwrap();
        assert_eq!((t.children(0), t.children(3), t.depth()), (1..5, 13..16, 2));
        let t = Tree::new(16, 15).unwrap();
        assert_eq!(
            (t.children(0), t.children(1), t.depth()),
            (1..16, 16..16, 1)
        );
        assert_eq!(Tree::default_degree(16), 4);
        assert_eq!(Tree::default_degree(2), 2);
        assert_eq!(Tree::default_degree(1000), MAX_CHILDREN);
    }

    #[test]
    fn bad_shapes_are_named() {
        assert_eq!(Tree::new(16, 0), Err(TreeError::Degree(0)));
        assert_eq!(Tree::new(16, 17), Err(TreeError::Degree(17)));
        assert_eq!(Tree::new(1, 2), Err(TreeError::TooSmall(1)));
        assert!(Tree::new(4, 2).unwrap().check_member(4).is_err());
    }

    #[test]
    fn results_go_to_an_administratively_scoped_group() {
        let (ip, mac) = result_address(0x00ab_cdef);
        assert_eq!(ip, Ipv4Addr::new(239, 0xab, 0xcd, 0xef));
        assert_eq!(mac, [0x01, 0x00, 0x5e, 0x2b, 0xcd, 0xef]);
        assert!(ip.is_multicast());
    }
}
