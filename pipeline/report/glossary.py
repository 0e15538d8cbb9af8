"""Every term the report uses: what it measures, which way is better and where it comes from. The glossary section and
the tooltips of the table headers read these, so a term is defined once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """name: as the report writes it. better: "higher", "lower", "closer to 0" or "" (a count or a setting).
    short: one line (a header's tooltip). long: the glossary's definition. source: the paper it comes from ("" for ours)."""

    name: str
    better: str
    short: str
    long: str
    source: str = ""

    @property
    def arrow(self) -> str:
        """↑ / ↓ / → 0 after a header: which way is better."""
        return {"higher": "↑", "lower": "↓", "closer to 0": "→0"}.get(self.better, "")

    @property
    def tooltip(self) -> str:
        return f"{self.short}" + (f" ({self.better} is better)" if self.better else "")


CONCEPTS = "Klotz et al., Evaluating the Interpretability of Sparse Autoencoders with Concept Annotations, 2026"

TERMS: dict[str, Term] = {t.name: t for t in [
    Term("MATCHScore", "higher", "mean F1 over attributes of each attribute's FBMP coalition of latents (training split)",
         "For every annotated attribute, FBMP picks a coalition of up to 3 latents whose OR best predicts the attribute on the "
         "training split (F_beta with beta 0.5 guides the choice; a latent joins only while the coalition's F1 rises). "
         "MATCHScore is the mean of the coalitions' F1 over attributes, in [0, 1]. Held-out MATCH is the same coalitions "
         "scored on the test split.", CONCEPTS),
    Term("Delta-MATCHScore", "higher", "MATCHScore of the trained model minus that of its untrained twin",
         "MATCHScore minus the untrained twin's, matched the same way. Bigger dictionaries match attributes better by "
         "chance; the difference removes what an untrained model already gets. Fixed bases (identity, PCA, ICA, a "
         "random rotation) train nothing: their twin is themselves and the difference is 0 by construction, not a failure.",
         CONCEPTS),
    Term("Delta-MATCHScore, strongest activations", "higher",
         "Delta-MATCHScore on each row's strongest activations only (evaluate.match_strongest of them)",
         "The same rule (FBMP, beta 0.5, coalitions of up to 3) on codes cut to each row's largest activations, trained "
         "less untrained. Binarising counts a latent that fires at 1% of its usual size like one that fires fully; at a "
         "large k a trained model's latents also fire weakly on rows without their concept, which costs it precision. "
         "When Delta-MATCHScore is negative but this one is positive, the trained model's strong activations do match "
         "the concepts better than its twin's: the negative sign comes from the binarisation at that k, not from "
         "the training. A diagnostic of this project, not a published metric."),
    Term("TAPAScore", "higher", "do the latents matched to an attribute switch on when it is added and off when it is removed",
         "On image pairs that differ in one edited attribute, the change of the matched latents' binarised activation: "
         "mean switch-on of the added attribute's coalition minus mean switch-on of the removed one's. In [-2, 2]; "
         "2 means every edit flips exactly the right latents, 0 is what unrelated latents score.", CONCEPTS),
    Term("Delta-stay", "lower", "mean change of the latents of attributes the edit left alone (leakage)",
         "On the same pairs, the mean absolute change of the coalitions of attributes present in both images and not "
         "edited: how much an edit leaks into unrelated latents. 0 is no leakage.", CONCEPTS),
    Term("FVU", "lower", "fraction of variance unexplained by the reconstruction (test split)",
         "Sum of squared reconstruction errors over the sum of squared deviations from the mean embedding, on the test "
         "split: 0 reconstructs exactly, 1 is no better than the mean. Plotted against K, the mean number of active latents."),
    Term("CKNNA", "higher", "do images that are neighbours in the codes stay neighbours in the embedding",
         "Centred kernel nearest-neighbour alignment between the codes and the embeddings: the kernel alignment "
         "restricted to pairs of images that are among each other's 10 nearest neighbours in both. Higher means the code "
         "keeps the embedding's local geometry; it does not say the latents mean anything (untrained codes score well too).",
         "Huh, Cheung, Wang, Isola, The Platonic Representation Hypothesis, 2024"),
    Term("FMS", "higher", "feature monosemanticity score: does one latent carry each concept, and only it",
         "Per attribute, a decision tree on the codes: how well its root latent alone predicts the attribute, how little "
         "deeper splits add, and how much accuracy drops when that latent is removed; averaged over attributes, in [0, 1].",
         "Härle et al., Measuring and Guiding Monosemanticity, 2025"),
    Term("FBMP", "", "Fully-Binary Matching Pursuit: the greedy choice of each attribute's coalition of latents",
         "Per attribute, start from its positive images as the residual; repeatedly take the latent whose activity best "
         "matches the residual (F_beta, beta 0.5), remove the images it covers, and keep it while the coalition's F1 "
         "improves; at most 3 latents. The published protocol behind MATCHScore and TAPAScore.", CONCEPTS),
    Term("LP CE", "closer to 0", "linear-probe cross-entropy on originals / on reconstructions",
         "A logistic-regression probe per one-hot attribute family, fitted on dense embeddings; its cross-entropy on the "
         "original test embeddings and on their reconstructions. The closer the two, the less the reconstruction loses "
         "of what the probe reads. Only for kinds whose attribute families are one-hot (objects scenes); multi scenes "
         "have none, so their probe columns are empty."),
    Term("LP KL", "lower", "KL divergence between the probe's predictions on originals and on reconstructions",
         "Mean KL divergence from the probe's class distribution on the original embedding to the one on its "
         "reconstruction: 0 when the reconstruction keeps everything the probe reads."),
    Term("never active", "lower", "fraction of latents never active on the test images (an SAE's dead latents)",
         "For an SAE, latents that never fire on the test split are dead: capacity the training wasted. For a rotation "
         "(CEDAR and the fixed bases) a latent is a half-axis (+i or -i) and only the k largest coordinates of an image "
         "are kept: half-axes that never win the top k at that k are never active by construction, not a failure "
         "(with k = 8 of 2d half-axes, most of them).", ""),
    Term("untrained twin", "", "same method, size, seed and data-dependent initialisation, never trained",
         "The sanity baseline: what the architecture and its sparsifier give without learning. Random codes fire each "
         "latent independently at the trained model's frequency. A metric measures learning only when trained codes "
         "score above both.", CONCEPTS),
    Term("noise floor", "", "the best-concept cosine that random directions reach under the same naming",
         "Latents are named by the vocabulary concepts most cosine-similar to their direction. Random directions also "
         "have a best concept; the 95th percentile of its cosine over 1,000 random directions is the floor: a name "
         "whose cosine is below it says little about the latent."),
    Term("describes the image", "higher", "a caption states at least one attribute and every stated attribute is true",
         "The caption decoder's caption of an embedding (dense, the sparse reconstruction, or top-k in the original "
         "basis) describes the image when it states at least one annotated attribute and all it states is true. On "
         "multi scenes only objects are annotated: a caption's background is not checked there."),
    Term("code digest", "", "sha256 of the pipeline's source files (pipeline/, stages/)",
         "A digest of the code's content: the same code gives the same digest whatever the git state. The git commit, "
         "when the project is a git checkout, is shown beside it."),
]}
