//! Which sequences of a paged decode step share their first keys: the same blocks of the store at
//! the start of their tables, as the prefix cache hands them out (a system prompt many requests
//! begin with). The tensor-core decode reads such keys once for a whole group
//! (flash_attention.cu `paged_prefix_flash_{bf16,f16}_d*`) and each member's own keys after them
//! (`paged_flash_decode_{bf16,f16}_d*` from its start), where it read every member's keys in full.
//! Blocks with the same id are the same rows of the store, so a group's result is each member's
//! attention over its own keys, whatever the grouping: only the partials' split differs.

/// Warps per block of the shared-keys kernel (flash_attention.cu `PX_WARPS`), each taking the
/// query heads of `16 / group` members as the rows of its MMAs.
pub(super) const PX_WARPS: usize = 4;
/// Keys per tile of the shared-keys kernel (`PX_KEYS`): a split is a multiple of it.
pub(super) const PX_KEYS: usize = 32;
/// Ints per tile descriptor (`PX_TILE`): table owner, shared keys, then up to 16 members a warp.
pub(super) const PX_TILE: usize = 2 + PX_WARPS * 16;

/// The groups of a step: each the keys its members share (a whole number of blocks) and the
/// members (indices into the step's sequences), in sequence order within the group.
#[derive(Debug, Default, PartialEq)]
pub(super) struct SharedPrefixes {
    pub groups: Vec<(usize, Vec<usize>)>,
}

impl SharedPrefixes {
    /// Each sequence's first own key: its group's shared keys, 0 for a sequence in no group.
    pub fn starts(&self, n: usize) -> Vec<usize> {
        let mut starts = vec![0; n];
        for (keys, members) in &self.groups {
            for &m in members {
                starts[m] = *keys;
            }
        }
        starts
    }

    /// The shared-keys kernel's tile descriptors for query groups of `gh` heads: the members of
    /// each group in tiles of `PX_WARPS * (16 / gh)`, each `[owner, keys, members.., -1..]` of
    /// `PX_TILE` ints (the owner: a member whose table the keys are read through).
    pub fn tiles(&self, gh: usize) -> Vec<i32> {
        let per_tile = members_per_tile(gh);
        let mut out = Vec::new();
        for (keys, members) in &self.groups {
            for chunk in members.chunks(per_tile) {
                out.extend([chunk[0] as i32, *keys as i32]);
                out.extend((0..PX_WARPS * 16).map(|i| chunk.get(i).map_or(-1, |&m| m as i32)));
            }
        }
        out
    }

    /// The shared keys the tiles of [`SharedPrefixes::tiles`] read in all (each tile its group's).
    pub fn tile_keys(&self, gh: usize) -> usize {
        self.groups.iter().map(|(keys, members)| keys * members.len().div_ceil(members_per_tile(gh))).sum()
    }

    /// The longest shared keys of any group (0 without groups).
    pub fn longest(&self) -> usize {
        self.groups.iter().map(|g| g.0).max().unwrap_or(0)
    }
}

/// Members of a group per tile of the shared-keys kernel for `gh` query heads per KV head: 16 / gh
/// a warp's MMA rows, `PX_WARPS` warps.
fn members_per_tile(gh: usize) -> usize {
    PX_WARPS * (16 / gh.clamp(1, 16))
}

/// The groups of sequences (`tables[i]` holding `lens[i]` positions, blocks of `bs`) that share at
/// least `min_keys` keys (0: none are grouped). Sequences sorted by their full blocks' ids sit
/// next to those they share most with; a run of neighbours becomes a group while the blocks all
/// its members share stay at least `min_keys` worth and at least half of what the run shared
/// before the newest member joined (so that a member sharing a little does not cut a long
/// prefix short for the rest: it starts a run of its own).
pub(super) fn shared_prefixes(tables: &[&[u32]], lens: &[usize], bs: usize, min_keys: usize) -> SharedPrefixes {
    let mut out = SharedPrefixes::default();
    if min_keys == 0 || bs == 0 || tables.len() < 2 {
        return out;
    }
    let min_blocks = min_keys.div_ceil(bs);
    // Only whole blocks below a sequence's length are shared (the prefix cache shares no
    // partial block), and all of them are keys the sequence attends.
    let full = |i: usize| &tables[i][..(lens[i] / bs).min(tables[i].len())];
    let mut order: Vec<usize> = (0..tables.len()).filter(|&i| full(i).len() >= min_blocks).collect();
    order.sort_by(|&a, &b| full(a).cmp(full(b)).then(a.cmp(&b)));
    let common = |a: usize, b: usize| full(a).iter().zip(full(b)).take_while(|(x, y)| x == y).count();
    let mut close = |run: &mut Vec<usize>, shared: usize| {
        if run.len() >= 2 {
            let mut members = std::mem::take(run);
            members.sort_unstable();
            out.groups.push((shared * bs, members));
        }
        run.clear();
    };
    let (mut run, mut shared) = (Vec::new(), usize::MAX);
    for &i in &order {
        if let Some(&last) = run.last() {
            let with = shared.min(common(last, i));
            if with >= min_blocks && (run.len() < 2 || 2 * with >= shared) {
                run.push(i);
                shared = with;
                continue;
            }
            close(&mut run, shared);
        }
        run.push(i);
        shared = usize::MAX;
    }
    close(&mut run, shared);
    out
}

#[cfg(test)]
mod tests {
    use super::{shared_prefixes, SharedPrefixes, PX_TILE};

    fn groups(tables: &[Vec<u32>], lens: &[usize], bs: usize, min_keys: usize) -> Vec<(usize, Vec<usize>)> {
        let t: Vec<&[u32]> = tables.iter().map(|t| &t[..]).collect();
        shared_prefixes(&t, lens, bs, min_keys).groups
    }

    /// A table of `shared` then fresh blocks numbered from `fresh`.
    fn table(shared: &[u32], fresh: u32, len: usize, bs: usize) -> Vec<u32> {
        let mut t = shared.to_vec();
        t.extend(fresh..fresh + (len.div_ceil(bs) - shared.len()) as u32);
        t
    }

    #[test]
    fn sequences_sharing_a_long_prefix_form_a_group() {
        let bs = 16;
        let prefix: Vec<u32> = (0..8).collect(); // 128 keys
        let tables = vec![
            table(&prefix, 100, 150, bs),
            table(&[0], 200, 150, bs), // shares one block only: the chat template's first tokens
            table(&prefix, 300, 140, bs),
            table(&[], 400, 300, bs),
            table(&prefix, 500, 129, bs),
        ];
        let lens = [150, 150, 140, 300, 129];
        assert_eq!(groups(&tables, &lens, bs, 64), vec![(128, vec![0, 2, 4])]);
        assert_eq!(groups(&tables, &lens, bs, 129), vec![], "under the least shared keys");
        assert_eq!(groups(&tables, &lens, bs, 0), vec![], "0 turns it off");
        // A member whose length reaches only into the shared blocks shares what it holds whole.
        let lens = [150, 150, 140, 300, 100];
        assert_eq!(groups(&tables, &lens, bs, 64), vec![(96, vec![0, 2, 4])]);
    }

    #[test]
    fn a_member_sharing_less_starts_its_own_run() {
        let bs = 16;
        let long: Vec<u32> = (0..40).collect();
        let tables = vec![
            table(&long, 100, 700, bs),
            table(&long, 200, 700, bs),
            table(&long[..5], 300, 700, bs), // 80 keys of the 640
            table(&long[..5], 400, 700, bs),
        ];
        let lens = [700; 4];
        // Not one group of 80 keys: the two sharing 640 keep them, the two sharing 80 pair up.
        assert_eq!(groups(&tables, &lens, bs, 64), vec![(640, vec![0, 1]), (80, vec![2, 3])]);
        // Two groups of different prefixes.
        let (a, b) = ([1, 2, 3, 4], [7, 8, 9, 10]);
        let tables =
            vec![table(&a, 100, 90, bs), table(&b, 200, 90, bs), table(&a, 300, 90, bs), table(&b, 400, 90, bs)];
        assert_eq!(groups(&tables, &[90; 4], bs, 64), vec![(64, vec![0, 2]), (64, vec![1, 3])]);
    }

    #[test]
    fn tiles_hold_the_members_a_block_of_warps_takes() {
        let sp = SharedPrefixes { groups: vec![(256, (0..20).collect()), (64, vec![30, 31])] };
        // Four query heads per KV head: 4 members a warp, 16 a tile: the first group takes two.
        let tiles = sp.tiles(4);
        assert_eq!(tiles.len(), 3 * PX_TILE);
        assert_eq!(&tiles[..4], &[0, 256, 0, 1]);
        assert_eq!(tiles[2 + 15], 15);
        assert_eq!(tiles[2 + 16], -1);
        assert_eq!(&tiles[PX_TILE..PX_TILE + 7], &[16, 256, 16, 17, 18, 19, -1]);
        assert_eq!(&tiles[2 * PX_TILE..2 * PX_TILE + 5], &[30, 64, 30, 31, -1]);
        // Eight heads (gpt-oss): 2 members a warp, 8 a tile.
        assert_eq!(sp.tiles(8).len(), 4 * PX_TILE);
        assert_eq!(sp.starts(32)[..3], [256, 256, 256]);
        assert_eq!(sp.starts(32)[20..], [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 64]);
        assert_eq!(sp.longest(), 256);
        assert_eq!((sp.tile_keys(4), sp.tile_keys(8)), (2 * 256 + 64, 3 * 256 + 64));
    }
}
