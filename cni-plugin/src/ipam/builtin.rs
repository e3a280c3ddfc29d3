//! placeholder (replaced by the built-in allocator branch)
use std::net::IpAddr;

use serde_json::Value;

use crate::{
    cni::{result::CniResult, AttachmentId},
    error::Error,
};

pub struct BuiltinIpam;

impl BuiltinIpam {
    pub fn new(_network: &str, _ipam: &Value, _ip_ranges: Option<&Value>) -> Result<Self, Error> {
        Err(Error::config(
            "ipam.type",
            "sluice",
            "built-in IPAM not merged yet",
        ))
    }
    pub fn add(&self, _id: &AttachmentId, _requested: &[IpAddr]) -> Result<CniResult, Error> {
        Err(Error::config(
            "ipam.type",
            "sluice",
            "built-in IPAM not merged yet",
        ))
    }
    pub fn del(&self, _id: &AttachmentId) -> Result<(), Error> {
        Ok(())
    }
    pub fn check(&self, _id: &AttachmentId) -> Result<Vec<IpAddr>, Error> {
        Ok(Vec::new())
    }
    pub fn gc(&self, _valid: &[AttachmentId]) -> Result<Vec<(AttachmentId, IpAddr)>, Error> {
        Ok(Vec::new())
    }
    pub fn status(&self) -> Result<(), Error> {
        Ok(())
    }
    pub fn gateways(&self) -> Vec<IpAddr> {
        Vec::new()
    }
}
