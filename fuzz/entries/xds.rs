//! xDS resource conversion: any bytes as a `RateLimitConfig` resource give rules or errors
//! naming the resource, after the bounds the xDS stream checks first.

use envoy_types::pb::google::protobuf::Any;
use prost::Message as _;
use slidegate::config::source::xds::bound;
use slidegate::config::source::xds::resource::{RESOURCE_TYPE, proto::RateLimitConfig, rules_from};

pub fn run(data: &[u8]) {
    let resources = [Any {
        type_url: RESOURCE_TYPE.into(),
        value: data.to_vec(),
    }];
    if let Err(errors) = bound::check(&resources) {
        assert!(!errors.0.is_empty());
        return;
    }
    match rules_from(&resources) {
        Ok(_) => assert!(RateLimitConfig::decode(data).is_ok()),
        Err(errors) => {
            assert!(!errors.0.is_empty());
            for error in &errors.0 {
                assert!(error.file.starts_with("xds:"), "{error}");
                assert!(!error.message.is_empty());
            }
        }
    }
}
