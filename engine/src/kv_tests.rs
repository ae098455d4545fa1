use super::*;
use crate::recurrent::RecurrentShape;

const SHAPE: KvShape = KvShape { n_layers: 2, kv_dim: 4 };

fn filled(n: usize) -> SeqCache {
    let mut c = SeqCache::new(SHAPE);
    c.reserve(n);
    for layer in 0..2 {
        let k: Vec<f32> = (0..n * 4).map(|i| (layer * 1000 + i) as f32).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        c.write(layer, 0, &k, &v);
    }
    c.commit(n);
    c
}

fn key(c: &SeqCache, layer: usize, pos: usize) -> Vec<f32> {
    let (k, _) = c.block_kv(layer, pos / BLOCK_TOKENS);
    k[(pos % BLOCK_TOKENS) * 4..][..4].iter().map(|x| x.to_f32()).collect()
}

#[test]
fn append_and_read_back() {
    let c = filled(70);
    assert_eq!(c.len(), 70);
    assert_eq!(c.blocks().len(), 3);
    assert_eq!(key(&c, 1, 69), vec![1276.0, 1277.0, 1278.0, 1279.0]);
    let (_, v) = c.block_kv(0, 0);
    assert_eq!(v[4].to_f32(), -4.0);
}

#[test]
fn truncate_drops_blocks() {
    let mut c = filled(70);
    c.truncate(33);
    assert_eq!(c.len(), 33);
    assert_eq!(c.blocks().len(), 2);
    c.truncate(100);
    assert_eq!(c.len(), 33);
    c.truncate(0);
    assert!(c.is_empty());
    assert!(c.blocks().is_empty());
}

#[test]
fn fork_shares_without_copying_then_copies_on_write() {
    let a = filled(70);
    let mut b = a.fork(40);
    assert_eq!(b.len(), 40);
    assert_eq!(b.shared_blocks(&a), 2);
    // Writing position 40 lands in the shared second block: b gets its own copy,
    // a is untouched, the first block stays shared.
    b.reserve(1);
    b.write(0, 40, &[9.0; 4], &[9.0; 4]);
    b.commit(1);
    assert_eq!(b.shared_blocks(&a), 1);
    assert_eq!(key(&b, 0, 40), vec![9.0; 4]);
    assert_eq!(key(&a, 0, 40), vec![160.0, 161.0, 162.0, 163.0]);
    assert_eq!(key(&b, 0, 39), key(&a, 0, 39));
}

#[test]
fn runs_round_trip_through_from_runs() {
    let a = filled(70);
    let runs: Vec<Vec<Vec<f16>>> = (0..2)
        .flat_map(|l| (0..2).map(move |w| (l, w)))
        .map(|(l, w)| a.runs(l, w).map(<[f16]>::to_vec).collect())
        .collect();
    assert_eq!(runs[0].iter().map(Vec::len).collect::<Vec<_>>(), vec![128, 128, 24]);
    let flat: Vec<Vec<f16>> = runs.iter().map(|r| r.concat()).collect();
    let b = SeqCache::from_runs::<()>(SHAPE, 50, |layer, which, pos0, dst| {
        dst.copy_from_slice(&flat[layer * 2 + which][pos0 * 4..pos0 * 4 + dst.len()]);
        Ok(())
    })
    .unwrap();
    assert_eq!(b.len(), 50);
    for pos in [0, 31, 32, 49] {
        assert_eq!(key(&b, 1, pos), key(&a, 1, pos));
    }
    let (_, v) = b.block_kv(0, 1);
    assert_eq!(v[4].to_f32(), -(32.0 * 4.0 + 4.0));
}

/// A sequence with recurrent state and no checkpoint forks whole or not at all, and
/// truncating it to fewer positions empties it; the state is shared until a fork writes it.
#[test]
fn recurrent_state_without_checkpoints_is_kept_only_with_every_position() {
    let shape = RecurrentShape { layers: 2, conv: 3, ssm: 4 };
    let mut a = filled(40);
    assert_eq!(a.restorable(30), 30, "no state: any prefix");
    assert!(a.recurrent_mut(shape).is_none(), "positions without state cannot continue");
    let mut a = SeqCache::new(SHAPE);
    a.recurrent_mut(shape).expect("a fresh sequence starts from zeros").layer_mut(1).1[2] = 5.0;
    a.reserve(40);
    a.commit(40);
    assert_eq!((a.restorable(40), a.restorable(99), a.restorable(39)), (40, 40, 0));
    let mut whole = a.fork(40);
    assert_eq!((whole.len(), a.fork(39).len()), (40, 0));
    assert!(a.fork(39).recurrent_mut(shape).is_some(), "an empty fork starts afresh");
    whole.recurrent_mut(shape).expect("shared state").layer_mut(1).1[2] = 7.0;
    assert_eq!(a.recurrent_mut(shape).expect("own state").layer_mut(1).1[2], 5.0, "copied on write");
    assert!(a.recurrent_mut(RecurrentShape { layers: 1, ..shape }).is_none(), "another model's state");
    let bytes = a.bytes();
    a.truncate(39);
    assert_eq!((a.len(), a.has_recurrent()), (0, false));
    assert!(bytes > a.bytes());
}

/// Run `n` positions of a hybrid sequence: the state's first value counts positions.
fn run_hybrid(c: &mut SeqCache, n: usize) {
    let shape = RecurrentShape { layers: 1, conv: 2, ssm: 2 };
    c.recurrent_mut(shape).expect("a state").layer_mut(0).0[0] += n as f32;
    c.reserve(n);
    c.commit(n);
}

fn counted(c: &SeqCache) -> Option<f32> {
    c.states().last().map(|(_, r)| r.conv()[0])
}

/// Checkpoints: a cut restores the newest one at or below it, with its own state (not
/// the later one), keeps the older checkpoints, and is accounted in `bytes`.
#[test]
fn cuts_restore_the_newest_checkpoint_at_or_below() {
    let mut a = SeqCache::new(SHAPE);
    run_hybrid(&mut a, 40);
    a.checkpoint();
    let one = a.bytes();
    assert_eq!(
        one,
        SeqCache::new(SHAPE).bytes() + 2 * BLOCK_TOKENS * 2 * 2 * 4 * 2 + 16,
        "a checkpoint at len costs nothing more"
    );
    run_hybrid(&mut a, 30);
    a.checkpoint();
    run_hybrid(&mut a, 10);
    assert_eq!(a.state_positions().collect::<Vec<_>>(), vec![40, 70, 80]);
    assert_eq!(a.bytes(), one + BLOCK_TOKENS * 2 * 2 * 4 * 2 + 2 * 16, "three states, three blocks");
    assert_eq!((a.restorable(80), a.restorable(79), a.restorable(69), a.restorable(39)), (80, 70, 40, 0));
    let b = a.fork(75);
    assert_eq!((b.len(), counted(&b)), (70, Some(70.0)));
    assert_eq!(b.state_positions().collect::<Vec<_>>(), vec![40, 70]);
    assert_eq!((a.len(), counted(&a)), (80, Some(80.0)), "the source keeps its own state");
    let mut c = a.clone();
    c.truncate(69);
    assert_eq!((c.len(), counted(&c), c.state_positions().count()), (40, Some(40.0), 1));
    // Continuing from the restored checkpoint writes a copy, never the snapshot.
    run_hybrid(&mut c, 5);
    assert_eq!((counted(&c), counted(&a.fork(40))), (Some(45.0), Some(40.0)));
    c.truncate(44);
    assert_eq!((c.len(), counted(&c)), (40, Some(40.0)));
    c.clear();
    assert_eq!((c.len(), c.state_positions().count()), (0, 0));
}

#[test]
fn restored_states_must_end_at_len() {
    let mut kv = filled(40);
    let st = || Arc::new(RecurrentState::new(RecurrentShape { layers: 1, conv: 1, ssm: 1 }));
    assert!(!kv.set_states(vec![(20, st())]), "the last state must be at len");
    assert!(!kv.set_states(vec![(30, st()), (20, st()), (40, st())]), "ascending");
    assert!(!kv.set_states(vec![(0, st()), (40, st())]), "no state before any position");
    assert!(!kv.has_recurrent());
    assert!(kv.set_states(vec![(20, st()), (40, st())]));
    assert_eq!(kv.states().map(|s| s.0).collect::<Vec<_>>(), vec![20, 40]);
    assert_eq!(kv.restorable(39), 20);
}

#[test]
fn fork_on_block_boundary_shares_all_full_blocks() {
    let a = filled(64);
    let mut b = a.fork(64);
    b.reserve(5);
    assert_eq!(b.shared_blocks(&a), 2);
    assert_eq!(b.blocks().len(), 3);
}

/// The GPU's copy back, any thread count, equals writing the same values per layer
/// (positions starting inside a block and ending inside another).
#[test]
fn layers_written_at_once_equal_layer_by_layer() {
    let (pos0, n) = (45, 60);
    let val = |layer: usize, which: usize, i: usize| (layer * 10_000 + which * 5_000 + i) as f32;
    let planes: Vec<Vec<f16>> =
        (0..4).map(|p| (0..n * 4).map(|i| f16::from_f32(val(p / 2, p % 2, i))).collect()).collect();
    let mut want = filled(pos0);
    want.reserve(n);
    for layer in 0..2 {
        let f = |which: usize| (0..n * 4).map(|i| val(layer, which, i)).collect::<Vec<f32>>();
        want.write(layer, pos0, &f(0), &f(1));
    }
    want.commit(n);
    for threads in [1, 3, 8] {
        let mut got = filled(pos0);
        got.reserve(n);
        got.write_f16_layers(pos0, n, |layer, which| &planes[layer * 2 + which], threads);
        got.commit(n);
        for layer in 0..2 {
            for which in 0..2 {
                assert!(got.runs(layer, which).eq(want.runs(layer, which)), "{threads} threads, layer {layer}");
            }
        }
    }
}

/// A backend's mirror for tests: the "device" copy of the live state.
struct DeviceCopy(RecurrentState);

impl MirrorData for DeviceCopy {
    fn fetch_state(&mut self, host: &mut RecurrentState) -> Result<()> {
        let (conv, ssm) = host.parts_mut();
        conv.copy_from_slice(self.0.conv());
        ssm.copy_from_slice(self.0.ssm());
        Ok(())
    }
}

/// A live state left on the device: nothing reads the stale host copy (states, clones
/// and forks fall back to the newest checkpoint); a checkpoint or `settle` fetches it.
#[test]
fn a_state_left_on_the_device_is_fetched_before_the_host_reads_it() {
    let mut a = SeqCache::new(SHAPE);
    run_hybrid(&mut a, 40);
    a.checkpoint();
    // A "GPU pass" of 8 more positions: the device's state counts 48, the host's 40.
    let mut device = a.recurrent().expect("a state").clone();
    device.layer_mut(0).0[0] = 48.0;
    a.reserve(8);
    a.commit(8);
    *a.mirror_mut() = Some(Mirror { len: 48, data: Box::new(DeviceCopy(device)) });
    a.leave_state_on_device();
    assert!(a.state_on_device());
    assert_eq!(a.state_positions().collect::<Vec<_>>(), vec![40], "the stale live state is not offered");
    assert_eq!((a.restorable(48), a.clone().len(), a.fork(48).len()), (40, 40, 40));
    assert_eq!(counted(&a.clone()), Some(40.0), "a clone restores the checkpoint");
    a.settle().expect("fetched");
    assert!(!a.state_on_device());
    assert_eq!((a.restorable(48), counted(&a), counted(&a.clone())), (48, Some(48.0), Some(48.0)));
    assert_eq!(counted(&a.fork(40)), Some(40.0), "the checkpoint kept its own values");

    // A checkpoint settles first; a cut back to a checkpoint leaves the host the truth.
    let device = a.recurrent().expect("a state").clone();
    a.leave_state_on_device();
    if let Some(m) = a.mirror_mut() {
        m.data = Box::new(DeviceCopy(device));
    }
    a.checkpoint();
    assert!(!a.state_on_device());
    assert_eq!(a.state_positions().collect::<Vec<_>>(), vec![40, 48]);
    a.leave_state_on_device();
    a.truncate(47);
    assert_eq!((a.len(), a.state_on_device(), counted(&a)), (40, false, Some(40.0)));
}
