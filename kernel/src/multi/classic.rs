//! The classic fits of [`pack_multi`](super::pack_multi): best-fit decreasing on the item's
//! dominant resource and first-fit decreasing, over bins classed by the resources they have
//! run out of (see the parent module for the rules).

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use super::{NONE, fits, too_many_steps};
use crate::Error;

/// The resource in which `item` takes the largest share of its capacity (the first on ties).
pub(crate) fn dominant(item: &[u64], caps: &[u64]) -> usize {
    let mut d = 0;
    for q in 1..item.len() {
        if (item[q] as u128) * (caps[d] as u128) > (item[d] as u128) * (caps[q] as u128) {
            d = q;
        }
    }
    d
}

/// Bins by the resources they have run out of: bit q of a bin's *class* is set when its room
/// in q is below the smallest positive size of q among the items to place, so no item that
/// needs q fits there. An item whose *need* (the resources where its size is positive) meets
/// a class cannot enter its bins: the fits skip whole classes instead of trying their bins one
/// by one (packs full of images, say, for every item with an image).
struct Classes {
    /// The smallest positive size of each resource (`u64::MAX`: no item needs it).
    least: Vec<u64>,
    /// 64-bit words of a set of classes.
    words: usize,
    /// For every need, the set of classes whose bins it may enter (`2^R × words`).
    compatible: Vec<u64>,
}

impl Classes {
    fn new(work: &[u64], caps: &[u64], rest: &[u32]) -> Self {
        let rx = caps.len();
        let mut least = alloc::vec![u64::MAX; rx];
        for &i in rest {
            for (l, &s) in least.iter_mut().zip(&work[i as usize * rx..][..rx]) {
                if s > 0 && s < *l {
                    *l = s;
                }
            }
        }
        let count = 1usize << rx;
        let words = count.div_ceil(64);
        let mut compatible = alloc::vec![0u64; count * words];
        for need in 0..count {
            for class in (0..count).filter(|&c| c & need == 0) {
                compatible[need * words + class / 64] |= 1 << (class % 64);
            }
        }
        Classes { least, words, compatible }
    }

    /// The class of a bin with `room`.
    fn of(&self, room: &[u64]) -> usize {
        room.iter().zip(&self.least).enumerate().fold(0, |c, (q, (r, l))| c | (usize::from(r < l) << q))
    }

    /// The need of `item`.
    fn need(item: &[u64]) -> usize {
        item.iter().enumerate().fold(0, |n, (q, &s)| n | (usize::from(s > 0) << q))
    }

    /// The classes an item with `need` may enter, as a bit set.
    fn compatible(&self, need: usize) -> &[u64] {
        &self.compatible[need * self.words..][..self.words]
    }
}

/// The smallest size in each resource among the items still to place, as the fit walks
/// through them: a bin with less room than that in some resource takes no more item (it is
/// *dead*), and the fits drop it from their search. Kept as breakpoints of the suffix minima.
pub(super) struct RestMin {
    rx: usize,
    /// Per resource, (from position, minimum) ascending by position.
    steps: Vec<Vec<(usize, u64)>>,
    /// Per resource, the current step.
    at: Vec<usize>,
    /// The current minima.
    now: Vec<u64>,
}

impl RestMin {
    pub(super) fn new(work: &[u64], caps: &[u64], rest: &[u32]) -> Self {
        let rx = caps.len();
        let mut steps: Vec<Vec<(usize, u64)>> = (0..rx).map(|_| Vec::new()).collect();
        let mut min = alloc::vec![u64::MAX; rx];
        for (p, &i) in rest.iter().enumerate().rev() {
            for q in 0..rx {
                let s = work[i as usize * rx + q];
                if s < min[q] {
                    min[q] = s;
                    steps[q].push((p, s));
                }
            }
        }
        for st in &mut steps {
            st.reverse();
        }
        let mut mins = RestMin { rx, steps, at: alloc::vec![0; rx], now: alloc::vec![u64::MAX; rx] };
        mins.advance(0);
        mins
    }

    /// Moves to position `p` (non-decreasing from call to call): entry (pₖ, mₖ) of a step
    /// list holds for the positions after pₖ₋₁ up to pₖ.
    fn advance(&mut self, p: usize) {
        for q in 0..self.rx {
            let st = &self.steps[q];
            while self.at[q] < st.len() && st[self.at[q]].0 < p {
                self.at[q] += 1;
            }
            self.now[q] = st.get(self.at[q]).map_or(u64::MAX, |&(_, m)| m);
        }
    }

    /// Whether a bin with `room` can take none of the items left.
    fn dead(&self, room: &[u64]) -> bool {
        room.iter().zip(&self.now).any(|(r, m)| r < m)
    }
}

/// Best fit on the item's dominant resource (see the module): per [class](Classes), one
/// ordered set of (room, bin) per resource over its open bins that are not dead
/// ([`RestMin`]); an item searches the classes it may enter.
pub(super) fn best_fit(
    work: &[u64],
    caps: &[u64],
    rest: &[u32],
    mut mins: RestMin,
    first: u32,
    assign: &mut Vec<u32>,
    max_steps: u64,
) -> Result<(), Error> {
    let mut steps: u64 = 0;
    let rx = caps.len();
    let classes = Classes::new(work, caps, rest);
    let mut rooms: Vec<u64> = Vec::new();
    // The class of each bin (`NONE`: dead), and per class its sets (empty until used).
    let mut class_of: Vec<u32> = Vec::new();
    let mut sets: Vec<Vec<BTreeSet<(u64, u32)>>> = (0..1usize << rx).map(|_| Vec::new()).collect();
    let mut used: Vec<usize> = Vec::new();
    let mut dead: Vec<u32> = Vec::new();
    for (p, &i) in rest.iter().enumerate() {
        mins.advance(p);
        let item = &work[i as usize * rx..][..rx];
        let d = dominant(item, caps);
        let compatible = classes.compatible(Classes::need(item));
        let mut found: Option<(u64, u32)> = None;
        for &c in &used {
            if compatible[c / 64] >> (c % 64) & 1 == 0 || sets[c].is_empty() {
                continue;
            }
            for &(room_d, b) in sets[c][d].range((item[d], 0)..) {
                if found.is_some_and(|best| best <= (room_d, b)) {
                    break;
                }
                steps += 1;
                if steps > max_steps {
                    return Err(too_many_steps(rest.len(), max_steps));
                }
                let room = &rooms[b as usize * rx..][..rx];
                if fits(item, room) {
                    found = Some((room_d, b));
                    break;
                }
                if mins.dead(room) {
                    dead.push(b);
                }
            }
        }
        for b in dead.drain(..) {
            let c = class_of[b as usize] as usize;
            for q in 0..rx {
                sets[c][q].remove(&(rooms[b as usize * rx + q], b));
            }
            class_of[b as usize] = NONE;
        }
        let b = match found {
            Some((_, b)) => {
                let c = class_of[b as usize] as usize;
                for q in 0..rx {
                    sets[c][q].remove(&(rooms[b as usize * rx + q], b));
                }
                b
            }
            None => {
                rooms.extend_from_slice(caps);
                class_of.push(NONE);
                (rooms.len() / rx - 1) as u32
            }
        };
        let room = &mut rooms[b as usize * rx..][..rx];
        for q in 0..rx {
            room[q] -= item[q];
        }
        mins.advance(p + 1);
        if mins.dead(room) {
            class_of[b as usize] = NONE;
        } else {
            let c = classes.of(room);
            if sets[c].is_empty() {
                sets[c] = (0..rx).map(|_| BTreeSet::new()).collect();
                used.push(c);
            }
            for q in 0..rx {
                sets[c][q].insert((room[q], b));
            }
            class_of[b as usize] = c as u32;
        }
        assign.push(first + b);
    }
    Ok(())
}

/// First fit over a tree of the bins' rooms: every node holds the largest room in each
/// resource among its leaves (bins in creation order; unopened bins hold the capacities;
/// dead bins ([`RestMin`]) hold nothing), and the search takes the leftmost leaf in which the
/// item fits in every resource.
pub(super) fn first_fit(
    work: &[u64],
    caps: &[u64],
    rest: &[u32],
    mut mins: RestMin,
    first: u32,
    lower_bound: u64,
    assign: &mut Vec<u32>,
    max_steps: u64,
) -> Result<(), Error> {
    let rx = caps.len();
    let mut steps: u64 = max_steps;
    let mut tree = RoomTree::new(caps, (lower_bound as usize).saturating_add(1), Classes::new(work, caps, rest));
    let mut opened = 0usize;
    let mut dead: Vec<usize> = Vec::new();
    for (p, &i) in rest.iter().enumerate() {
        mins.advance(p);
        let item = &work[i as usize * rx..][..rx];
        if opened == tree.leaves {
            tree = tree.grow();
        }
        // An unopened leaf fits every item within the capacities: the search succeeds.
        let b = tree
            .find(item, &mins, &mut dead, &mut steps)
            .ok_or_else(|| too_many_steps(rest.len(), max_steps))?
            .unwrap_or(opened);
        for d in dead.drain(..) {
            tree.kill(d);
        }
        opened = opened.max(b + 1);
        mins.advance(p + 1);
        tree.take(b, item);
        if mins.dead(tree.leaf(b)) {
            tree.kill(b);
        }
        assign.push(first + b as u32);
    }
    Ok(())
}

/// The tree of [`first_fit`]: `max[node·R + q]`, nodes numbered from 1 (leaves from `leaves`),
/// and `present[node·words..]`, the set of the [classes](Classes) of the live bins below.
struct RoomTree {
    rx: usize,
    leaves: usize,
    max: Vec<u64>,
    present: Vec<u64>,
    caps: Vec<u64>,
    classes: Classes,
}

impl RoomTree {
    fn new(caps: &[u64], at_least: usize, classes: Classes) -> Self {
        let leaves = at_least.max(1).next_power_of_two();
        let rx = caps.len();
        let mut max = Vec::with_capacity(2 * leaves * rx);
        for _ in 0..2 * leaves {
            max.extend_from_slice(caps);
        }
        let (words, empty) = (classes.words, classes.of(caps));
        let mut present = alloc::vec![0u64; 2 * leaves * words];
        for node in 1..2 * leaves {
            present[node * words + empty / 64] |= 1 << (empty % 64);
        }
        RoomTree { rx, leaves, max, present, caps: caps.to_vec(), classes }
    }

    /// Twice the leaves: the old leaves keep their rooms, the new ones hold the capacities.
    fn grow(self) -> Self {
        let RoomTree { rx, leaves, max, present, caps, classes } = self;
        let w = classes.words;
        let mut bigger = RoomTree::new(&caps, leaves * 2, classes);
        bigger.max[bigger.leaves * rx..(bigger.leaves + leaves) * rx].copy_from_slice(&max[leaves * rx..]);
        bigger.present[bigger.leaves * w..(bigger.leaves + leaves) * w].copy_from_slice(&present[leaves * w..]);
        for node in (1..bigger.leaves).rev() {
            bigger.pull(node);
        }
        bigger
    }

    /// Node `node`'s rooms and classes from its children's.
    fn pull(&mut self, node: usize) {
        let (rx, w) = (self.rx, self.classes.words);
        for q in 0..rx {
            self.max[node * rx + q] = self.max[2 * node * rx + q].max(self.max[(2 * node + 1) * rx + q]);
        }
        for k in 0..w {
            self.present[node * w + k] = self.present[2 * node * w + k] | self.present[(2 * node + 1) * w + k];
        }
    }

    /// Leaf `b`'s rooms.
    fn leaf(&self, b: usize) -> &[u64] {
        &self.max[(self.leaves + b) * self.rx..][..self.rx]
    }

    /// Sets leaf `b`'s class set (after its rooms changed) and updates the nodes above.
    fn settle(&mut self, b: usize, live: bool) {
        let w = self.classes.words;
        let mut node = self.leaves + b;
        let class = self.classes.of(self.leaf(b));
        self.present[node * w..][..w].fill(0);
        if live {
            self.present[node * w + class / 64] |= 1 << (class % 64);
        }
        while node > 1 {
            node /= 2;
            self.pull(node);
        }
    }

    /// Empties leaf `b` (a dead bin: no item left fits there).
    fn kill(&mut self, b: usize) {
        let rx = self.rx;
        self.max[(self.leaves + b) * rx..][..rx].fill(0);
        self.settle(b, false);
    }

    /// The leftmost leaf in which `item` fits in every resource (`Some(None)`: none);
    /// leaves found dead on the way go to `dead`. `None` once `steps` (the steps left) runs
    /// out.
    fn find(&self, item: &[u64], mins: &RestMin, dead: &mut Vec<usize>, steps: &mut u64) -> Option<Option<usize>> {
        let (rx, w) = (self.rx, self.classes.words);
        let compatible = self.classes.compatible(Classes::need(item));
        // Depth-first, left before right: at most two entries a level (≤ 2^32 leaves).
        let mut stack = [0usize; 72];
        let (mut top, mut node) = (0usize, 1usize);
        loop {
            *steps = steps.checked_sub(1)?;
            let room = &self.max[node * rx..][..rx];
            let enter =
                fits(item, room) && self.present[node * w..][..w].iter().zip(compatible).any(|(p, c)| p & c != 0);
            if node >= self.leaves && !enter && mins.dead(room) && self.present[node * w..][..w].iter().any(|&x| x != 0)
            {
                dead.push(node - self.leaves);
            }
            if enter {
                if node >= self.leaves {
                    return Some(Some(node - self.leaves));
                }
                stack[top] = 2 * node + 1;
                top += 1;
                node = 2 * node;
                continue;
            }
            if top == 0 {
                return Some(None);
            }
            top -= 1;
            node = stack[top];
        }
    }

    /// Takes `item` out of leaf `b`'s rooms.
    fn take(&mut self, b: usize, item: &[u64]) {
        let rx = self.rx;
        let node = self.leaves + b;
        for (q, s) in item.iter().enumerate() {
            self.max[node * rx + q] -= s;
        }
        self.settle(b, true);
    }
}
