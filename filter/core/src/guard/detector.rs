//! The built-in detectors by their stable names: the name a rule gives in
//! the configuration, a metric's label and a span's attribute, and (in
//! capitals) a masked value's placeholder.

/// One built-in detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DetectorId {
    /// OpenAI keys (`sk-`, `sk-proj-`) and other `sk-` keys.
    OpenaiKey,
    /// Anthropic keys (`sk-ant-`).
    AnthropicKey,
    /// Stripe keys (`sk_`, `pk_live_`, `rk_live_`).
    StripeKey,
    /// GitHub tokens (`ghp_`, `gho_`, `ghs_`, `ghu_`, `ghr_`, `github_pat_`).
    GithubToken,
    /// GitLab personal access tokens (`glpat-`).
    GitlabToken,
    /// Slack tokens (`xox?-`, `xapp-`).
    SlackToken,
    /// Hugging Face tokens (`hf_`).
    HuggingfaceToken,
    /// Google API keys (`AIza`).
    GoogleApiKey,
    /// Google OAuth access tokens (`ya29.`).
    GoogleOauthToken,
    /// AWS access key ids (`AKIA`, `ASIA` and 16 of `A-Z0-9`).
    AwsAccessKeyId,
    /// JSON web tokens.
    Jwt,
    /// PEM private key blocks.
    PrivateKey,
    /// The credential after `Bearer`.
    BearerToken,
    /// The credential after `Basic`.
    BasicAuth,
    /// A value joined by `:` or `=` to a credential's name (`password=…`).
    NamedCredential,
    /// E-mail addresses.
    Email,
    /// Phone numbers: `+` and 9 to 15 digits, North American and
    /// trunk-prefixed national formats with separators.
    Phone,
    /// Payment card numbers: a known issuer's prefix and length, Luhn-valid.
    CreditCard,
    /// International bank account numbers, their country's length and
    /// mod-97 check digits.
    Iban,
    /// US social security numbers, `AAA-GG-SSSS` with a valid area, group
    /// and serial.
    UsSsn,
    /// IPv4 addresses.
    Ipv4,
    /// IPv6 addresses.
    Ipv6,
}

use DetectorId as D;

impl DetectorId {
    /// Every detector, secrets first.
    pub const ALL: [DetectorId; 22] = [
        D::OpenaiKey,
        D::AnthropicKey,
        D::StripeKey,
        D::GithubToken,
        D::GitlabToken,
        D::SlackToken,
        D::HuggingfaceToken,
        D::GoogleApiKey,
        D::GoogleOauthToken,
        D::AwsAccessKeyId,
        D::Jwt,
        D::PrivateKey,
        D::BearerToken,
        D::BasicAuth,
        D::NamedCredential,
        D::Email,
        D::Phone,
        D::CreditCard,
        D::Iban,
        D::UsSsn,
        D::Ipv4,
        D::Ipv6,
    ];

    /// The stable name.
    pub const fn name(self) -> &'static str {
        match self {
            D::OpenaiKey => "openai_key",
            D::AnthropicKey => "anthropic_key",
            D::StripeKey => "stripe_key",
            D::GithubToken => "github_token",
            D::GitlabToken => "gitlab_token",
            D::SlackToken => "slack_token",
            D::HuggingfaceToken => "huggingface_token",
            D::GoogleApiKey => "google_api_key",
            D::GoogleOauthToken => "google_oauth_token",
            D::AwsAccessKeyId => "aws_access_key_id",
            D::Jwt => "jwt",
            D::PrivateKey => "private_key",
            D::BearerToken => "bearer_token",
            D::BasicAuth => "basic_auth",
            D::NamedCredential => "named_credential",
            D::Email => "email",
            D::Phone => "phone",
            D::CreditCard => "credit_card",
            D::Iban => "iban",
            D::UsSsn => "us_ssn",
            D::Ipv4 => "ipv4",
            D::Ipv6 => "ipv6",
        }
    }

    /// The detector of that name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }

    /// A secret (a key, a token, a credential), not personal data.
    pub const fn is_secret(self) -> bool {
        (self as u8) < (D::Email as u8)
    }

    const fn bit(self) -> u32 {
        1 << (self as u8)
    }
}

/// A set of built-in detectors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Set(u32);

impl Set {
    /// No detector.
    pub const NONE: Set = Set(0);
    /// Every detector.
    pub const ALL: Set = Set((1 << DetectorId::ALL.len()) - 1);
    /// The keys, tokens and credentials.
    pub const SECRETS: Set = Set(D::Email.bit() - 1);
    /// The personal data.
    pub const PERSONAL: Set = Set(Self::ALL.0 & !Self::SECRETS.0);
    /// What capture redacts (`tracing.capture.redact_builtins`): the
    /// secrets, e-mail addresses, and the personal data a checksum
    /// validates (payment cards, IBANs), which a false positive is rare in.
    pub const CAPTURE: Set =
        Set(Self::SECRETS.0 | D::Email.bit() | D::CreditCard.bit() | D::Iban.bit());

    /// This set and `id`.
    pub const fn with(self, id: DetectorId) -> Set {
        Set(self.0 | id.bit())
    }

    /// `id` is in the set.
    pub const fn has(self, id: DetectorId) -> bool {
        self.0 & id.bit() != 0
    }

    /// No detector is in the set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The detectors in the set.
    pub fn iter(self) -> impl Iterator<Item = DetectorId> {
        DetectorId::ALL.into_iter().filter(move |d| self.has(*d))
    }
}

impl FromIterator<DetectorId> for Set {
    fn from_iter<I: IntoIterator<Item = DetectorId>>(ids: I) -> Self {
        ids.into_iter().fold(Set::NONE, Set::with)
    }
}

/// What found a value: a built-in detector or an operator's rule (by its
/// index among the rules [`super::Detectors`] was built from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Detector {
    /// A built-in detector.
    Builtin(DetectorId),
    /// An operator's rule: its glob patterns or its words.
    Custom(u16),
}
