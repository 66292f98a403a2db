//! The gRPC request path from raw bytes: the wire pre-count (descriptors and entries counted
//! before anything is decoded), the decoding of a `RateLimitRequest`, then the decision. The
//! first two bytes choose the bounds on descriptors and entries; the rest is the message.

use prost::Message as _;
use slidegate::limiter::{LimitError, RequestLimits};
use slidegate::service::rls::{self, Counted};
use slidegate::service::wire::WireRequest;

use super::common;

pub fn run(data: &[u8]) {
    let Some((&[descriptors, entries], body)) = data.split_first_chunk::<2>() else {
        return;
    };
    let limits = RequestLimits {
        max_descriptors: usize::from(descriptors % 8),
        max_entries: usize::from(entries % 8),
        ..RequestLimits::default()
    };
    let counted = rls::check_counts(body, &limits);
    let plain = WireRequest::decode(body);
    // The pre-count calls undecodable only what does not decode.
    if let Err(Counted::Undecodable(error)) = &counted {
        assert!(
            plain.is_err(),
            "counted as undecodable ({error}) but decodes"
        );
    }
    // On what decodes, the pre-count refuses exactly what is over the bounds.
    if let Ok(request) = &plain {
        let within = request.descriptors.len() <= limits.max_descriptors
            && (request.descriptors.iter()).all(|d| d.entries.len() <= limits.max_entries);
        assert_eq!(counted.is_ok(), within, "{counted:?}");
    }
    match rls::decode(body, &limits) {
        Ok(request) => {
            assert!(plain.as_ref().is_ok_and(|plain| *plain == request));
            for entry in request.descriptors.iter().flat_map(|d| &d.entries) {
                // Kept as text only when no NUL is in it: an escaped entry starts with one.
                assert_eq!(
                    entry.escaped,
                    entry.key.contains('\0') || entry.value.contains('\0')
                );
            }
            let domain = request.domain();
            let decided = request.request(&domain);
            assert_eq!(decided.descriptors.len(), request.descriptors.len());
            match futures::executor::block_on(common::LIMITER.should_rate_limit(&decided)) {
                Ok(response) => assert_eq!(response.statuses.len(), request.descriptors.len()),
                Err(LimitError::InvalidArgument(message)) => assert!(!message.is_empty()),
                Err(other) => panic!("{other:?}"),
            }
        }
        Err(LimitError::InvalidArgument(message)) => assert!(!message.is_empty()),
        Err(other) => panic!("{other:?}"),
    }
}
