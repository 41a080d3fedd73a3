//! The prefix cache: keys and values of texts that ended, kept in a radix tree of token runs
//! under a memory budget, from which a new prompt's longest cached prefix is copied into its
//! slot.
//!
//! Why it exists: a chat client sends the whole conversation every turn and many requests share
//! a system prompt, so most of a prompt's keys and values were often computed before. A tree
//! stores a prefix shared by many texts once (a run is split where two texts part), is sized by
//! bytes rather than by a count of whole conversations, and gives way least recently used
//! leaf first. Keys and values of a token depend only on the tokens before it, never on how
//! they were batched, so a prompt started from a stored run computes the same bits as one
//! prefilled from scratch. Runs are copies that no sequence writes to: speculation's rollback
//! acts on a sequence's own slot and cannot reach them. One store per model, on the worker
//! that owns the model's cache.
//!
//! Texts are kept by scope (a tenant: an API key), each scope a tree of its own: a prompt is
//! only ever started from texts of its own scope, so whether a text is cached (which a
//! response's `cached_tokens` and its timing show) tells a client nothing about another's.

use std::collections::HashMap;

use super::kv_cache::{KvCache, KvRun};
use crate::model::Result;

/// Tokens `a` and `b` share from the start.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The root of scope 0 (requests with no scope of their own share it).
const ROOT: usize = 0;

struct Node {
    parent: usize,
    /// The run's tokens (empty only for the root).
    tokens: Vec<u32>,
    kv: Option<KvRun>,
    /// By the first token of each child's run (children's runs start differently).
    children: HashMap<u32, usize>,
    /// When it was stored or last read (a counter): the least recent leaf is evicted first.
    used: u64,
}

/// What the store holds, for gauges and load reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixStoreStats {
    pub tokens: usize,
    pub bytes: usize,
    pub budget_bytes: usize,
    /// Runs in the tree.
    pub runs: usize,
    /// Runs evicted for room since the last [`PrefixStore::take_evictions`].
    pub evictions: u64,
}

/// A radix tree of token runs with their keys and values, at most `budget_bytes` of them.
pub struct PrefixStore {
    budget_bytes: usize,
    bytes_per_token: usize,
    /// Slab of nodes; `None` is a free entry. Entry 0 is scope 0's root.
    nodes: Vec<Option<Node>>,
    /// The root of each other scope holding texts.
    roots: HashMap<u64, usize>,
    free: Vec<usize>,
    clock: u64,
    tokens: usize,
    evictions: u64,
}

impl PrefixStore {
    /// A store for a cache whose tokens take `bytes_per_token` each (keys and values, every
    /// layer), holding at most `budget_bytes`.
    pub fn new(budget_bytes: usize, bytes_per_token: usize) -> Self {
        let root = Node {
            parent: ROOT,
            tokens: Vec::new(),
            kv: None,
            children: HashMap::new(),
            used: 0,
        };
        Self {
            budget_bytes,
            bytes_per_token: bytes_per_token.max(1),
            nodes: vec![Some(root)],
            roots: HashMap::new(),
            free: Vec::new(),
            clock: 0,
            tokens: 0,
            evictions: 0,
        }
    }

    pub fn stats(&self) -> PrefixStoreStats {
        PrefixStoreStats {
            tokens: self.tokens,
            bytes: self.tokens * self.bytes_per_token,
            budget_bytes: self.budget_bytes,
            runs: self
                .nodes
                .iter()
                .flatten()
                .filter(|n| !n.tokens.is_empty())
                .count(),
            evictions: self.evictions,
        }
    }

    fn node(&self, id: usize) -> &Node {
        self.nodes[id].as_ref().expect("a live node")
    }

    fn node_mut(&mut self, id: usize) -> &mut Node {
        self.nodes[id].as_mut().expect("a live node")
    }

    fn root(&self, scope: u64) -> Option<usize> {
        match scope {
            0 => Some(ROOT),
            s => self.roots.get(&s).copied(),
        }
    }

    /// The path of runs `text` follows from `root`: each run's id and how many of its tokens
    /// `text` shares (all of them but perhaps the last's).
    fn path(&self, root: Option<usize>, text: &[u32]) -> Vec<(usize, usize)> {
        let mut path = Vec::new();
        let Some(root) = root else {
            return path;
        };
        let (mut at, mut pos) = (root, 0);
        while let Some(&child) = text.get(pos).and_then(|t| self.node(at).children.get(t)) {
            let shared = common_prefix(&self.node(child).tokens, &text[pos..]);
            path.push((child, shared));
            pos += shared;
            if shared < self.node(child).tokens.len() {
                break;
            }
            at = child;
        }
        path
    }

    /// Tokens of `prompt`'s start, at most `limit`, that the store holds in `scope`.
    pub fn longest(&self, scope: u64, prompt: &[u32], limit: usize) -> usize {
        let text = &prompt[..limit.min(prompt.len())];
        self.path(self.root(scope), text)
            .iter()
            .map(|&(_, n)| n)
            .sum()
    }

    /// Appends to `slot` (empty, or allocated here) the keys and values of the longest start of
    /// `prompt`, at most `limit` tokens, that the store holds in `scope`; how many tokens.
    pub fn load(
        &mut self,
        cache: &mut KvCache,
        slot: usize,
        scope: u64,
        prompt: &[u32],
        limit: usize,
    ) -> Result<usize> {
        let text = &prompt[..limit.min(prompt.len())];
        let path = self.path(self.root(scope), text);
        self.clock += 1;
        let mut loaded = 0;
        for (id, n) in path {
            let node = self.nodes[id].as_mut().expect("a live node");
            node.used = self.clock;
            cache.append_run(slot, node.kv.as_ref().expect("a run holds keys"), n)?;
            loaded += n;
        }
        Ok(loaded)
    }

    /// Starts `slot` (empty) from the longer of what the store holds of `prompt`'s start in
    /// `scope` and what `running` (another slot, and how many of the prompt's first tokens it
    /// holds) does, at most `limit` tokens; how many tokens the slot holds then. The store wins
    /// a tie: its runs are what the running slot would copy.
    pub fn start(
        &mut self,
        cache: &mut KvCache,
        slot: usize,
        scope: u64,
        (prompt, limit): (&[u32], usize),
        running: Option<(usize, usize)>,
    ) -> Result<usize> {
        let stored = self.longest(scope, prompt, limit);
        match running.map(|(from, n)| (from, n.min(limit))) {
            Some((from, n)) if n > stored => {
                cache.copy_prefix(from, slot, n)?;
                Ok(n)
            }
            _ => self.load(cache, slot, scope, prompt, limit),
        }
    }

    /// Stores what `slot` holds for `text` (its first `text.len()` positions) in `scope`: the
    /// part the scope's tree does not hold yet becomes a new run, split from a run it shares a
    /// start with; then least recently used runs are evicted until the store is within its
    /// budget.
    pub fn insert(&mut self, cache: &KvCache, slot: usize, scope: u64, text: &[u32]) -> Result<()> {
        let room = self.budget_bytes / self.bytes_per_token;
        let text = &text[..text.len().min(room)];
        if text.is_empty() {
            return Ok(());
        }
        self.clock += 1;
        let root = match self.root(scope) {
            Some(r) => r,
            None => {
                let r = self.alloc(Node {
                    parent: ROOT,
                    tokens: Vec::new(),
                    kv: None,
                    children: HashMap::new(),
                    used: self.clock,
                });
                self.roots.insert(scope, r);
                r
            }
        };
        let mut at = root;
        let mut pos = 0;
        for (id, n) in self.path(Some(root), text) {
            self.node_mut(id).used = self.clock;
            pos += n;
            at = id;
            if n < self.node(id).tokens.len() {
                self.split(id, n)?;
            }
        }
        let mut last = at;
        if pos < text.len() {
            let kv = cache.read_run(slot, pos, text.len() - pos)?;
            last = self.attach(at, text[pos..].to_vec(), kv);
            self.tokens += text.len() - pos;
        }
        self.evict_to_budget(last);
        Ok(())
    }

    /// Cuts run `id` after `at` tokens: `id` keeps the head and gets the tail as its one
    /// child, which takes over its children.
    fn split(&mut self, id: usize, at: usize) -> Result<()> {
        let node = self.node_mut(id);
        let kv = node.kv.as_mut().expect("a run holds keys").split_off(at)?;
        let tokens = node.tokens.split_off(at);
        node.tokens.shrink_to_fit();
        let children = std::mem::take(&mut node.children);
        let used = node.used;
        let first = tokens[0];
        let tail = self.alloc(Node {
            parent: id,
            tokens,
            kv: Some(kv),
            children,
            used,
        });
        let grandchildren: Vec<usize> = self.node(tail).children.values().copied().collect();
        for g in grandchildren {
            self.node_mut(g).parent = tail;
        }
        self.node_mut(id).children.insert(first, tail);
        Ok(())
    }

    fn attach(&mut self, parent: usize, tokens: Vec<u32>, kv: KvRun) -> usize {
        let first = tokens[0];
        let id = self.alloc(Node {
            parent,
            tokens,
            kv: Some(kv),
            children: HashMap::new(),
            used: self.clock,
        });
        self.node_mut(parent).children.insert(first, id);
        id
    }

    fn alloc(&mut self, node: Node) -> usize {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    /// Evicts the least recently used leaves other than `keep` until the store fits its
    /// budget.
    fn evict_to_budget(&mut self, keep: usize) {
        while self.tokens * self.bytes_per_token > self.budget_bytes {
            let leaf = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(id, n)| Some((id, n.as_ref()?)))
                .filter(|&(id, n)| !n.tokens.is_empty() && id != keep && n.children.is_empty())
                .min_by_key(|&(_, n)| n.used)
                .map(|(id, _)| id);
            let Some(leaf) = leaf else {
                return;
            };
            self.remove_leaf(leaf);
            self.evictions += 1;
        }
    }

    fn remove_leaf(&mut self, id: usize) {
        let node = self.nodes[id].take().expect("a live node");
        self.free.push(id);
        self.tokens -= node.tokens.len();
        let parent = self.node_mut(node.parent);
        parent.children.remove(&node.tokens[0]);
        // A scope whose last text went forgets its root.
        if parent.tokens.is_empty() && parent.children.is_empty() && node.parent != ROOT {
            self.nodes[node.parent] = None;
            self.free.push(node.parent);
            self.roots.retain(|_, r| *r != node.parent);
        }
    }

    /// Runs evicted since the last call (for a counter).
    pub fn take_evictions(&mut self) -> u64 {
        std::mem::take(&mut self.evictions)
    }

    /// Forgets every run.
    pub fn clear(&mut self) {
        let evictions = self.evictions;
        *self = Self::new(self.budget_bytes, self.bytes_per_token);
        self.evictions = evictions;
    }
}

#[cfg(test)]
mod tests;
