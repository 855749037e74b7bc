//! A configuration's problems, each with the dotted path of the field it
//! concerns. Every component checks its own section into one [`Problems`],
//! so that an operator fixes a file in one pass rather than one error per
//! restart.

use serde::Serialize;

/// One problem, with the dotted path of the field it concerns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigProblem {
    pub field: String,
    pub message: String,
}

/// Every problem found so far.
#[derive(Debug, Default)]
pub struct Problems(Vec<ConfigProblem>);

impl Problems {
    pub fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigProblem {
            field: field.into(),
            message: message.into(),
        });
    }

    pub fn into_vec(self) -> Vec<ConfigProblem> {
        self.0
    }
}
