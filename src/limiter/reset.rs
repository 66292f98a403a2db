//! Clearing a request's counters (`DELETE /counters` on the operator listener): "unblock this
//! customer".
//!
//! The request is explained first ([`RateLimiter::explain`]), so the counters cleared are exactly
//! those a real request with these descriptors would be decided by (the same rules, `replaces`,
//! overrides and keys), and the answer can say what each held. Then the store forgets them in
//! every representation ([`Store::clear`](crate::store::Store::clear)).

use super::{Explanation, LimitError, RateLimiter, Request};

impl RateLimiter {
    /// Clears the counters of `request`'s descriptors: every limit of each, or where `name` is
    /// given only the limits it names (a limit's own `name`, or every limit of a rule of that
    /// name). Returns the explanation with only the counters cleared, each with the hits it held
    /// just before.
    pub async fn clear(
        &self,
        request: &Request<'_>,
        name: Option<&str>,
    ) -> Result<Explanation, LimitError> {
        let mut explained = self.explain(request).await?;
        for descriptor in &mut explained.descriptors {
            let Some(name) = name else {
                continue;
            };
            // A limit's own name first: a rule under `rate_limits` takes its first limit's.
            let by_limit = descriptor
                .counters
                .iter()
                .any(|c| c.name.as_deref() == Some(name));
            let rule_named = descriptor
                .rule
                .as_ref()
                .is_some_and(|rule| rule.name.as_deref() == Some(name));
            descriptor.counters.retain(|c| match by_limit {
                true => c.name.as_deref() == Some(name),
                false => rule_named,
            });
        }
        let keys: Vec<_> = explained
            .descriptors
            .iter()
            .flat_map(|d| d.counters.iter().map(|c| c.key.clone()))
            .collect();
        if keys.is_empty() {
            return Ok(explained);
        }
        let held = self
            .store
            .clear(&keys)
            .await
            .map_err(LimitError::Unavailable)?;
        // A counter gone between the explanation and the clear held nothing to clear.
        let mut held = held.into_iter();
        for counter in explained
            .descriptors
            .iter_mut()
            .flat_map(|d| d.counters.iter_mut())
        {
            if !held.next().unwrap_or(false) {
                counter.held = 0;
            }
        }
        Ok(explained)
    }
}
