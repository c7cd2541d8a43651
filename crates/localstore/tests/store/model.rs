//! Model-based property test: random sequences of create, delete, claim, release and reopen
//! against a small in-memory model; the store and the model must agree after every step.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use localstore::{CapacityRange, ErrorKind, Store, VolumeState};
use proptest::prelude::*;

use crate::common::{Root, assert_consistent, request, root_or_skip};

const NAMES: [&str; 4] = ["a", "b", "c", "d"];
const TARGETS: [&str; 2] = ["/consumer/1/r/mount", "/consumer/2/r/mount"];

#[derive(Debug, Clone)]
enum Step {
    Create { name: usize, size: u64, tier: usize },
    Delete { name: usize },
    Claim { name: usize, target: usize },
    Release { name: usize, target: usize },
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..NAMES.len(), 0..3u64, 0..2usize)
            .prop_map(|(name, size, tier)| Step::Create { name, size: size * 1024, tier }),
        2 => (0..NAMES.len()).prop_map(|name| Step::Delete { name }),
        2 => (0..NAMES.len(), 0..TARGETS.len()).prop_map(|(name, target)| Step::Claim { name, target }),
        2 => (0..NAMES.len(), 0..TARGETS.len()).prop_map(|(name, target)| Step::Release { name, target }),
        1 => Just(Step::Reopen),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ModelVolume {
    size: u64,
    tier: usize,
    claim: Option<usize>,
}

fn tier(t: usize) -> &'static str {
    ["fast", "slow"][t]
}

/// What the model says a step returns: `Ok(())` or the error kind.
fn apply(model: &mut BTreeMap<usize, ModelVolume>, step: &Step) -> Result<(), ErrorKind> {
    match *step {
        Step::Create { name, size, tier } => match model.get(&name) {
            // Both bounds zero means any size, as in CSI.
            Some(v) if (size == 0 || v.size == size) && v.tier == tier => Ok(()),
            Some(_) => Err(ErrorKind::Incompatible),
            None => {
                model.insert(
                    name,
                    ModelVolume {
                        size,
                        tier,
                        claim: None,
                    },
                );
                Ok(())
            }
        },
        Step::Delete { name } => match model.get(&name) {
            Some(v) if v.claim.is_some() => Err(ErrorKind::FailedPrecondition),
            _ => {
                model.remove(&name);
                Ok(())
            }
        },
        Step::Claim { name, target } => match model.get_mut(&name) {
            None => Err(ErrorKind::NotFound),
            Some(v) => match v.claim {
                Some(t) if t != target => Err(ErrorKind::FailedPrecondition),
                _ => {
                    v.claim = Some(target);
                    Ok(())
                }
            },
        },
        Step::Release { name, target } => match model.get_mut(&name) {
            Some(v) => match v.claim {
                Some(t) if t != target => Err(ErrorKind::FailedPrecondition),
                _ => {
                    v.claim = None;
                    Ok(())
                }
            },
            None => Ok(()),
        },
        Step::Reopen => Ok(()),
    }
}

fn run(store: &mut Store, root: &Root, step: &Step) -> Result<(), ErrorKind> {
    let id = |name: usize| store.volume_id(NAMES[name]).unwrap();
    let result = match *step {
        Step::Create {
            name,
            size,
            tier: t,
        } => store
            .create(
                &request(NAMES[name])
                    // An exact range, so any other size is incompatible.
                    .with_capacity(CapacityRange {
                        required_bytes: size,
                        limit_bytes: size,
                    })
                    .with_parameter("tier", tier(t)),
            )
            .map(drop),
        Step::Delete { name } => store.delete(&id(name)),
        Step::Claim { name, target } => {
            store.claim(&id(name), Path::new(TARGETS[target])).map(drop)
        }
        Step::Release { name, target } => store.release(&id(name), Path::new(TARGETS[target])),
        Step::Reopen => {
            // Replace the store: the old one must be dropped first to release the lock.
            let placeholder = Store::open_read_only(root.path(), crate::common::options()).unwrap();
            drop(std::mem::replace(store, placeholder));
            *store = root.open();
            Ok(())
        }
    };
    result.map_err(|e| e.kind())
}

fn agree(store: &Store, model: &BTreeMap<usize, ModelVolume>) {
    assert_consistent(store);
    let records = store.list().unwrap();
    let mut seen = BTreeMap::new();
    for record in records {
        let name = NAMES.iter().position(|n| *n == record.name).unwrap();
        assert_eq!(record.state, VolumeState::Ready);
        let t = ["fast", "slow"]
            .iter()
            .position(|t| record.parameters["tier"] == *t)
            .unwrap();
        let claim = store.claim_of(&record.volume_id).unwrap().map(|c| {
            TARGETS
                .iter()
                .position(|t| Path::new(t) == c.target)
                .unwrap()
        });
        seen.insert(
            name,
            ModelVolume {
                size: record.capacity_bytes,
                tier: t,
                claim,
            },
        );
    }
    assert_eq!(&seen, model);
    let claimed: Vec<PathBuf> = store
        .claims()
        .unwrap()
        .into_iter()
        .map(|c| c.target)
        .collect();
    assert_eq!(
        claimed.len(),
        model.values().filter(|v| v.claim.is_some()).count()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn store_agrees_with_model(steps in proptest::collection::vec(step(), 1..40)) {
        if !root_or_skip("model::store_agrees_with_model") {
            return Ok(());
        }
        let root = Root::new();
        let mut store = root.open();
        let mut model = BTreeMap::new();
        for step in &steps {
            let expected = apply(&mut model, step);
            let actual = run(&mut store, &root, step);
            prop_assert_eq!(actual, expected, "step {:?}", step);
            agree(&store, &model);
        }
    }
}
