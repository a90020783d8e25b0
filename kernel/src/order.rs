//! The order of micro-batches in a plan ([`Order`]) and how it is applied.

use alloc::vec::Vec;

/// The order of micro-batches in a plan. Members of a micro-batch are always ascending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Order {
    /// By smallest member index (input order).
    #[default]
    None,
    /// By cost descending, ties by smallest member index ascending.
    CostDesc,
    /// verl's and ROLL's micro-batch order: sort by (cost, smallest member) descending into
    /// `L`, then `L[::2][::-1] + L[1::2]` (the smallest at both ends).
    Verl,
    /// ROLL's (and verl's) in-rank sample order applied to micro-batches: sort by (cost,
    /// smallest member) ascending into `p`, then `p[::2] + p[1::2][::-1]`.
    Roll,
}

/// Reorders `items` by `order`, given each item's cost and its tie-breaking key.
pub(crate) fn apply_order<T, C: Ord, K: Ord>(
    mut items: Vec<T>,
    order: Order,
    cost: impl Fn(&T) -> C,
    key: impl Fn(&T) -> K,
) -> Vec<T> {
    match order {
        Order::None => items.sort_by_key(|t| key(t)),
        Order::CostDesc => items.sort_by(|a, b| cost(b).cmp(&cost(a)).then(key(a).cmp(&key(b)))),
        Order::Verl => {
            items.sort_by(|a, b| (cost(b), key(b)).cmp(&(cost(a), key(a))));
            return ends_small(items, true);
        }
        Order::Roll => {
            items.sort_by(|a, b| (cost(a), key(a)).cmp(&(cost(b), key(b))));
            return ends_small(items, false);
        }
    }
    items
}

/// `L[::2][::-1] + L[1::2]` (`evens_reversed`) or `L[::2] + L[1::2][::-1]`.
fn ends_small<T>(items: Vec<T>, evens_reversed: bool) -> Vec<T> {
    let mut evens = Vec::with_capacity(items.len().div_ceil(2));
    let mut odds = Vec::with_capacity(items.len() / 2);
    for (i, t) in items.into_iter().enumerate() {
        if i % 2 == 0 { evens.push(t) } else { odds.push(t) }
    }
    if evens_reversed {
        evens.reverse();
    } else {
        odds.reverse();
    }
    evens.extend(odds);
    evens
}
