//! The evaluator's vehicles, each in a slot of one vector and found by id
//! through a map. A reorder window's due queue names a vehicle by its
//! slot: a release reaches the vehicle without hashing its id, and can ask
//! for the slots it will reach next to be loaded ahead. In a steady stream
//! every release reaches a vehicle last touched a window ago, long out of
//! cache, so a release that waits for its vehicle's state costs more than
//! the work it does with it (docs/decisions/0022-vehicle-slots.md).

use super::prefetch::prefetch;
use crate::model::VehicleId;
use std::collections::HashMap;

/// A vehicle's slot as it was when the reference was taken: a slot freed
/// (its vehicle expired) and given to another vehicle no longer matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRef {
    slot: u32,
    generation: u32,
}

struct Slot<T> {
    id: VehicleId,
    /// Bumped each time the slot is freed.
    generation: u32,
    /// `None` while the slot is free.
    value: Option<T>,
}

pub struct VehicleSlots<T> {
    /// foldhash, seeded per process: SipHash was a visible share of the
    /// per-event cost, and a random seed still keeps crafted ids from
    /// colliding on purpose.
    by_id: HashMap<VehicleId, u32, foldhash::fast::RandomState>,
    slots: Vec<Slot<T>>,
    /// Freed slots, reused before the vector grows.
    free: Vec<u32>,
}

impl<T> Default for VehicleSlots<T> {
    fn default() -> Self {
        Self {
            by_id: HashMap::default(),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> VehicleSlots<T> {
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn get(&self, id: &str) -> Option<&T> {
        let &slot = self.by_id.get(id)?;
        self.slots[slot as usize].value.as_ref()
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut T> {
        let &slot = self.by_id.get(id)?;
        self.slots[slot as usize].value.as_mut()
    }

    /// The vehicle's slot and value, inserting `fresh()` for a vehicle not
    /// yet here. A known vehicle (the common case) costs no clone of its id.
    pub fn get_or_insert_with(
        &mut self,
        id: &VehicleId,
        fresh: impl FnOnce() -> T,
    ) -> (SlotRef, &mut T)
    where
        T: Default,
    {
        let slot = match self.by_id.get(id) {
            Some(&slot) => slot,
            None => self.occupy(id.clone(), fresh()),
        };
        let s = &mut self.slots[slot as usize];
        let at = SlotRef {
            slot,
            generation: s.generation,
        };
        // Every slot the map names is occupied: the default is never made.
        let value = s.value.get_or_insert_with(T::default);
        (at, value)
    }

    /// Puts `value` in the vehicle's slot, taking one for a new vehicle.
    pub fn insert(&mut self, id: VehicleId, value: T) -> SlotRef {
        let slot = match self.by_id.get(&id) {
            Some(&slot) => {
                self.slots[slot as usize].value = Some(value);
                slot
            }
            None => self.occupy(id, value),
        };
        SlotRef {
            slot,
            generation: self.slots[slot as usize].generation,
        }
    }

    fn occupy(&mut self, id: VehicleId, value: T) -> u32 {
        let slot = match self.free.pop() {
            Some(slot) => {
                let s = &mut self.slots[slot as usize];
                s.id = id.clone();
                s.value = Some(value);
                slot
            }
            None => {
                let slot = u32::try_from(self.slots.len())
                    .expect("fewer than 2^32 vehicles in one evaluator");
                self.slots.push(Slot {
                    id: id.clone(),
                    generation: 0,
                    value: Some(value),
                });
                slot
            }
        };
        self.by_id.insert(id, slot);
        slot
    }

    /// The vehicle `at` names, if its slot still holds it.
    pub fn at_mut(&mut self, at: SlotRef) -> Option<(&VehicleId, &mut T)> {
        let s = self.slots.get_mut(at.slot as usize)?;
        if s.generation != at.generation {
            return None;
        }
        let value = s.value.as_mut()?;
        Some((&s.id, value))
    }

    /// [`Self::at_mut`], read only: for a look ahead.
    pub fn peek(&self, at: SlotRef) -> Option<&T> {
        let s = self.slots.get(at.slot as usize)?;
        (s.generation == at.generation)
            .then_some(s.value.as_ref())
            .flatten()
    }

    /// Starts loading the slot `at` names. Only a hint.
    pub fn prefetch(&self, at: SlotRef) {
        if let Some(s) = self.slots.get(at.slot as usize) {
            prefetch(s);
        }
    }

    /// Keeps the vehicles `keep` says to keep, freeing the others' slots.
    pub fn retain(&mut self, mut keep: impl FnMut(&VehicleId, &mut T) -> bool) {
        for (i, s) in self.slots.iter_mut().enumerate() {
            let Some(value) = s.value.as_mut() else {
                continue;
            };
            if keep(&s.id, value) {
                continue;
            }
            s.value = None;
            s.generation = s.generation.wrapping_add(1);
            self.by_id.remove(&s.id);
            self.free.push(i as u32);
        }
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&VehicleId, &mut T)> {
        self.slots
            .iter_mut()
            .filter_map(|s| s.value.as_mut().map(|v| (&s.id, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(n: u8) -> VehicleId {
        VehicleId::from(format!("v{n}"))
    }

    #[test]
    fn a_freed_slot_given_to_another_vehicle_no_longer_answers_for_the_first() {
        let mut slots = VehicleSlots::default();
        let first = slots.insert(id(1), 10);
        slots.retain(|_, _| false);
        assert!(slots.at_mut(first).is_none());
        let second = slots.insert(id(2), 20);
        assert!(slots.at_mut(first).is_none(), "the slot is reused");
        assert_eq!(
            slots.at_mut(second).map(|(v, x)| (v.clone(), *x)),
            Some((id(2), 20))
        );
        assert_eq!(slots.get("v1"), None);
    }

    proptest! {
        /// Whatever the inserts and expiries, the slots hold what a plain
        /// map would, and every reference taken answers for its own
        /// vehicle or for none.
        #[test]
        fn slots_hold_what_a_map_holds(ops in prop::collection::vec((0u8..12, 0u8..3), 1..200)) {
            let mut slots = VehicleSlots::default();
            let mut map = std::collections::BTreeMap::new();
            let mut refs = Vec::new();
            for (n, op) in ops {
                match op {
                    0 => {
                        let (at, value) = slots.get_or_insert_with(&id(n), || 0u32);
                        *value += 1;
                        *map.entry(id(n)).or_insert(0u32) += 1;
                        refs.push((id(n), at));
                    }
                    1 => {
                        slots.retain(|v, _| *v != id(n));
                        map.remove(&id(n));
                    }
                    _ => {
                        refs.push((id(n), slots.insert(id(n), 7)));
                        map.insert(id(n), 7);
                    }
                }
            }
            prop_assert_eq!(slots.len(), map.len());
            let mut held: Vec<_> = slots.iter_mut().map(|(v, x)| (v.clone(), *x)).collect();
            held.sort();
            prop_assert_eq!(held, map.iter().map(|(v, x)| (v.clone(), *x)).collect::<Vec<_>>());
            for (vehicle, at) in refs {
                if let Some((v, x)) = slots.at_mut(at) {
                    prop_assert_eq!(v, &vehicle);
                    prop_assert_eq!(Some(&*x), map.get(&vehicle));
                }
            }
        }
    }
}
