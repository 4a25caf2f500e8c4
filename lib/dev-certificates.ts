// A local development CA and a certificate for localhost, kept under a folder (DATA_DIR/listen)
// for `npm run listen`. The service trusts the CA only when WEBHOOK_CA_FILE names it, so nothing
// here widens what a production instance accepts.
//
// Keys come from Node's crypto (OpenSSL); node-forge only builds and signs the certificates.
// Keys that node-forge generates itself now and then fail to load in OpenSSL ("illegal
// padding", see test/helpers/https-receiver.ts), which a kept file must never do.
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import forge from "node-forge";

export interface DevelopmentCertificates {
	/** The CA certificate's file: what WEBHOOK_CA_FILE names. */
	caFile: string;
	caPem: string;
	/** The localhost certificate and its key, for https.createServer, and their files. */
	cert: string;
	key: string;
	certFile: string;
	keyFile: string;
	/** True when this call made them (false: they were kept from an earlier run). */
	created: boolean;
}

const CA_YEARS = 10;
const LEAF_DAYS = 397;
// A kept localhost certificate this close to its end is made again (signed by the same CA).
const RENEW_BEFORE_MS = 30 * 24 * 3600 * 1000;
export const LOCALHOST_NAMES = { dns: ["localhost"], ips: ["127.0.0.1", "::1"] };

function keyPair(): { privatePem: string; publicKey: forge.pki.PublicKey; privateKey: forge.pki.PrivateKey } {
	const { privateKey, publicKey } = crypto.generateKeyPairSync("rsa", { modulusLength: 2048 });
	const privatePem = privateKey.export({ type: "pkcs1", format: "pem" }).toString();
	return {
		privatePem,
		privateKey: forge.pki.privateKeyFromPem(privatePem),
		publicKey: forge.pki.publicKeyFromPem(publicKey.export({ type: "spki", format: "pem" }).toString()),
	};
}

function serialNumber(): string {
	// Positive (high bit clear) and unique per certificate.
	const bytes = crypto.randomBytes(16);
	bytes[0] &= 0x7f;
	return bytes.toString("hex");
}

function makeCa(): { certPem: string; keyPem: string } {
	const keys = keyPair();
	const cert = forge.pki.createCertificate();
	cert.publicKey = keys.publicKey;
	cert.serialNumber = serialNumber();
	cert.validity.notBefore = new Date(Date.now() - 60_000);
	cert.validity.notAfter = new Date(Date.now() + CA_YEARS * 365 * 24 * 3600 * 1000);
	const subject = [{ name: "commonName", value: "satellite-webhooks local development CA" }];
	cert.setSubject(subject);
	cert.setIssuer(subject);
	cert.setExtensions([
		{ name: "basicConstraints", cA: true, pathLenConstraint: 0, critical: true },
		{ name: "keyUsage", keyCertSign: true, cRLSign: true, critical: true },
		{ name: "subjectKeyIdentifier" },
	]);
	cert.sign(keys.privateKey as forge.pki.rsa.PrivateKey, forge.md.sha256.create());
	return { certPem: forge.pki.certificateToPem(cert), keyPem: keys.privatePem };
}

function makeLocalhostCertificate(caCertPem: string, caKeyPem: string): { certPem: string; keyPem: string } {
	const caCert = forge.pki.certificateFromPem(caCertPem);
	const caKey = forge.pki.privateKeyFromPem(caKeyPem);
	const keys = keyPair();
	const cert = forge.pki.createCertificate();
	cert.publicKey = keys.publicKey;
	cert.serialNumber = serialNumber();
	cert.validity.notBefore = new Date(Date.now() - 60_000);
	cert.validity.notAfter = new Date(Date.now() + LEAF_DAYS * 24 * 3600 * 1000);
	cert.setSubject([{ name: "commonName", value: "localhost" }]);
	cert.setIssuer(caCert.subject.attributes);
	cert.setExtensions([
		{ name: "basicConstraints", cA: false, critical: true },
		{ name: "keyUsage", digitalSignature: true, keyEncipherment: true, critical: true },
		// clientAuth too, as mkcert's certificates have it: a node can present the same certificate to a
		// local NATS server that verifies its clients (NATS_CERT_FILE).
		{ name: "extKeyUsage", serverAuth: true, clientAuth: true },
		{
			name: "subjectAltName",
			altNames: [...LOCALHOST_NAMES.dns.map(value => ({ type: 2, value })), ...LOCALHOST_NAMES.ips.map(ip => ({ type: 7, ip }))],
		},
		{ name: "authorityKeyIdentifier", keyIdentifier: caCert.generateSubjectKeyIdentifier().getBytes() },
	]);
	cert.sign(caKey, forge.md.sha256.create());
	return { certPem: forge.pki.certificateToPem(cert), keyPem: keys.privatePem };
}

/** Whether a kept localhost certificate is still good: signed by this CA, valid well beyond now. */
function usable(certPem: string, caPem: string): boolean {
	try {
		const cert = new crypto.X509Certificate(certPem);
		const ca = new crypto.X509Certificate(caPem);
		return cert.verify(ca.publicKey) && Date.parse(cert.validTo) - Date.now() > RENEW_BEFORE_MS && Date.parse(ca.validTo) > Date.parse(cert.validTo);
	} catch {
		return false;
	}
}

function readIfPresent(file: string): string | undefined {
	return fs.existsSync(file) ? fs.readFileSync(file, "utf8") : undefined;
}

/**
 * Returns the development CA and localhost certificate kept in `dir`, making what is missing or
 * about to run out. The CA is kept across runs, so that a service started with WEBHOOK_CA_FILE
 * pointing at it goes on trusting every later localhost certificate.
 */
export function ensureDevelopmentCertificates(dir: string): DevelopmentCertificates {
	fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
	const files = {
		ca: path.join(dir, "ca.pem"),
		caKey: path.join(dir, "ca-key.pem"),
		cert: path.join(dir, "localhost.pem"),
		key: path.join(dir, "localhost-key.pem"),
	};
	let created = false;
	let caPem = readIfPresent(files.ca);
	let caKeyPem = readIfPresent(files.caKey);
	if (!caPem || !caKeyPem) {
		const ca = makeCa();
		caPem = ca.certPem;
		caKeyPem = ca.keyPem;
		fs.writeFileSync(files.caKey, caKeyPem, { mode: 0o600 });
		fs.writeFileSync(files.ca, caPem);
		created = true;
	}
	let cert = readIfPresent(files.cert);
	let key = readIfPresent(files.key);
	if (!cert || !key || !usable(cert, caPem)) {
		const leaf = makeLocalhostCertificate(caPem, caKeyPem);
		cert = leaf.certPem;
		key = leaf.keyPem;
		fs.writeFileSync(files.key, key, { mode: 0o600 });
		fs.writeFileSync(files.cert, cert);
		created = true;
	}
	return { caFile: files.ca, caPem, cert, key, certFile: files.cert, keyFile: files.key, created };
}
