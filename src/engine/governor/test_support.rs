//! Shared fixtures of the governor's tests.

use super::costs::CostModel;
use super::governor_state::Governor;
use super::planner::plan_round;

pub fn costs(draft: f64, verify: &[f64]) -> CostModel {
    let mut c = CostModel::new(verify.len());
    c.record_draft(draft * 3.0, (0.0, 0), 3, 1);
    for (i, &v) in verify.iter().enumerate() {
        c.record_verify(v, i + 1);
    }
    c
}

/// The plan for one request alone, as its governor sees it.
pub fn solo(g: &Governor, c: &CostModel) -> usize {
    plan_round(&[g.candidate(1, 8, (0, 1000), None)], 0, c, 1.02)[0]
}
