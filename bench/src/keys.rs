//! The requests: one template per worker whose descriptor values are rewritten in place for
//! every call, drawn from the key space (uniform or Zipf).

use std::fmt::Write as _;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use rand::Rng as _;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Zipf};

use crate::BenchError;
use crate::args::{BenchArgs, KeyDistribution};

/// A request with `descriptors` descriptors of one entry `(key, "")` each; [`set_values`] fills
/// in the values.
pub fn request_template(
    domain: &str,
    key: &str,
    descriptors: usize,
    hits: u32,
) -> RateLimitRequest {
    let descriptor = RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_string(),
            value: String::new(),
        }],
        ..Default::default()
    };
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: vec![descriptor; descriptors],
        hits_addend: hits,
    }
}

/// Sets the value of the descriptor at `position` to `"{position}-{pick(position)}"`, in place:
/// the strings keep their memory from call to call.
pub fn set_values(request: &mut RateLimitRequest, mut pick: impl FnMut(usize) -> u64) {
    for (position, descriptor) in request.descriptors.iter_mut().enumerate() {
        let picked = pick(position);
        for entry in &mut descriptor.entries {
            entry.value.clear();
            // Writing to a `String` cannot fail.
            let _ = write!(entry.value, "{position}-{picked}");
        }
    }
}

/// The key space the descriptor values are drawn from.
pub enum KeySpace {
    Uniform(u64),
    Zipf(Zipf<f64>),
}

impl KeySpace {
    pub fn new(args: &BenchArgs) -> Result<Self, BenchError> {
        match args.distribution {
            KeyDistribution::Uniform => Ok(KeySpace::Uniform(args.keys)),
            KeyDistribution::Zipf => Zipf::new(args.keys as f64, args.zipf_exponent)
                .map(KeySpace::Zipf)
                .map_err(|e| BenchError::Invalid(format!("--zipf-exponent: {e}"))),
        }
    }

    pub fn sample(&self, rng: &mut SmallRng) -> u64 {
        match self {
            KeySpace::Uniform(n) => rng.random_range(0..*n),
            // Zipf yields 1..=n as a float; shift to 0-based.
            KeySpace::Zipf(zipf) => zipf.sample(rng) as u64 - 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng as _;

    use super::*;
    use crate::args::test_args;

    #[test]
    fn zipf_keys_stay_in_range() {
        let args = BenchArgs {
            distribution: KeyDistribution::Zipf,
            zipf_exponent: 1.2,
            ..test_args()
        };
        let space = KeySpace::new(&args).expect("valid zipf");
        let mut rng = SmallRng::seed_from_u64(7);
        let samples: Vec<u64> = (0..10_000).map(|_| space.sample(&mut rng)).collect();
        assert!(samples.iter().all(|&k| k < 10));
        let hottest = samples.iter().filter(|&&k| k == 0).count();
        assert!(hottest > 2_000, "key 0 should dominate, got {hottest}");
    }
}
