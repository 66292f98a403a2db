//! The glob rules of a mapper file, kept as upstream's finite-state machine
//! (`pkg/mapper/fsm`): which rule wins, and which never can, follows from how that tree is
//! built, so it is reproduced whole. Apart from the file's loading and the public API because
//! it is a self-contained structure with its own search.

use std::collections::HashMap;

use super::MetricKind;

/// One tree of states per metric type, built exactly as upstream's `FSM.AddState` builds it,
/// because which rule wins (and which never can) follows from that construction.
#[derive(Debug, Clone)]
pub(super) struct Fsm {
    states: Vec<State>,
}

#[derive(Debug, Clone, Default)]
struct State {
    transitions: HashMap<String, usize>,
    /// The fewest and most dot parts left after this state, over the patterns through it.
    min_left: usize,
    max_left: usize,
    /// The rule that created this state as its last part. Upstream sets it only when it
    /// creates the state, so a later pattern ending at an existing state does not get it.
    result: Option<usize>,
    /// The position of the last rule that ended here; the lowest wins.
    priority: usize,
}

impl Fsm {
    /// The roots, one per [`MetricKind`], are states 0, 1 and 2.
    pub(super) fn new() -> Fsm {
        Fsm {
            states: vec![State::default(); MetricKind::ALL.len()],
        }
    }

    pub(super) fn add(&mut self, pattern: &str, kind: Option<MetricKind>, rule: usize) {
        let fields: Vec<&str> = pattern.split('.').collect();
        let roots: Vec<usize> = match kind {
            None => MetricKind::ALL.iter().map(|k| k.index()).collect(),
            Some(k) => vec![k.index()],
        };
        for root in roots {
            let mut at = root;
            for (i, field) in fields.iter().enumerate() {
                let left = fields.len() - i - 1;
                at = match self.states[at].transitions.get(*field) {
                    Some(&next) => {
                        let s = &mut self.states[next];
                        s.max_left = s.max_left.max(left);
                        s.min_left = s.min_left.min(left);
                        next
                    }
                    None => {
                        let next = self.states.len();
                        self.states.push(State {
                            min_left: left,
                            max_left: left,
                            result: (left == 0).then_some(rule),
                            ..State::default()
                        });
                        self.states[at]
                            .transitions
                            .insert((*field).to_owned(), next);
                        next
                    }
                };
            }
            self.states[at].priority = rule;
        }
    }

    /// Upstream's `FSM.GetMapping` with ordering on: every path is searched (the exact part
    /// before `*`), and the final state with the lowest priority wins. The captures are a
    /// fixed array written at each `*` step and copied whole, as upstream does.
    pub(super) fn lookup<'n>(
        &self,
        fields: &[&'n str],
        kind: MetricKind,
    ) -> Option<(usize, Vec<&'n str>)> {
        let mut search = Search {
            fsm: self,
            fields,
            captures: vec![""; fields.len()],
            best: None,
        };
        search.from(kind.index(), 0, 0);
        let (state, captures) = search.best?;
        Some((self.states[state].result?, captures))
    }
}

struct Search<'f, 'n> {
    fsm: &'f Fsm,
    fields: &'f [&'n str],
    captures: Vec<&'n str>,
    /// The winning final state so far and its captures.
    best: Option<(usize, Vec<&'n str>)>,
}

impl<'n> Search<'_, 'n> {
    /// Tries the transitions out of `state` for field `i`; `capture` is the next capture slot.
    fn from(&mut self, state: usize, i: usize, capture: usize) {
        let fsm = self.fsm;
        let transitions = &fsm.states[state].transitions;
        let field = self.fields[i];
        let left = self.fields.len() - i - 1;
        let fits = |s: usize| {
            let s = &fsm.states[s];
            s.min_left <= left && left <= s.max_left
        };
        let exact = transitions.get(field).copied().filter(|&s| fits(s));
        let star = transitions.get("*").copied().filter(|&s| fits(s));
        // A part that is literally `*` takes the exact transition first without capturing,
        // as upstream does.
        if let Some(next) = exact {
            self.visit(next, i, capture);
        }
        if let Some(next) = star {
            self.captures[capture] = field;
            self.visit(next, i, capture + 1);
        }
    }

    fn visit(&mut self, state: usize, i: usize, capture: usize) {
        let fsm = self.fsm;
        let s = &fsm.states[state];
        if s.result.is_some() && i + 1 == self.fields.len() {
            let better = match &self.best {
                None => true,
                Some((b, _)) => fsm.states[*b].priority > s.priority,
            };
            if better {
                self.best = Some((state, self.captures.clone()));
            }
            return;
        }
        if i + 1 < self.fields.len() && !s.transitions.is_empty() {
            self.from(state, i + 1, capture);
        }
    }
}
