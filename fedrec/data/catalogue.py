"""The known data sets (`fedrec data list`): files, parsers, sources, checksums, citations."""

from __future__ import annotations

from fedrec.data import parsers
from fedrec.data.sources import DatasetSpec, RawFile, Source

_MOVIELENS = (
    "F. Maxwell Harper and Joseph A. Konstan. 2015. The MovieLens Datasets: History and "
    "Context. ACM TiiS 5(4):19. https://doi.org/10.1145/2827872"
)
_HETREC = (
    "Ivan Cantador, Peter Brusilovsky and Tsvi Kuflik. 2011. 2nd Workshop on Information "
    "Heterogeneity and Fusion in Recommender Systems (HetRec 2011). RecSys 2011."
)

def _hetrec_lastfm(*members: str) -> Source:
    """The GroupLens HetRec Last.fm archive, keeping ``members``."""
    return Source(
        "GroupLens",
        "https://files.grouplens.org/datasets/hetrec2011/hetrec2011-lastfm-2k.zip",
        # GroupLens publishes no hash for the HetRec archives; this md5 is the one
        # pinned by sisinflab/DataRec (datarec/datasets/lastfm/lastfm_2011.py).
        checksum="md5:296d61afe4e8632b173fc2dd3be20ce2",
        checksum_source="sisinflab/DataRec datarec/datasets/lastfm/lastfm_2011.py",
        members=members,
    )


_LASTFM_FOLDERS = ("lastfm-2k", "hetrec2011-lastfm-2k", "lastfm", "lastfm-2k-hetrec")

REGISTRY: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            name="ml-100k",
            description="MovieLens 100K: 100,000 ratings (1-5) by 943 users on 1,682 movies",
            citation=_MOVIELENS,
            homepage="https://grouplens.org/datasets/movielens/100k/",
            files=(
                RawFile("u.data", parsers.parse_ml100k, note="GroupLens original"),
                RawFile(
                    "ml-100k.inter",
                    parsers.parse_atomic,
                    # The file inside the recbole==1.2.1 wheel (same rows, same order as u.data).
                    sha256="4edb74e2a81178c2ba9ff381495f754f996c4aea351b1272ca36b43da0935eff",
                    note="RecBole atomic copy",
                ),
                RawFile(
                    "ratings.dat",
                    parsers.parse_pfedrec_csv,
                    # PFedRec's copy (Zhangcx19/IJCAI-23-PFedRec data/ml-100k/ratings.dat).
                    sha256="807b9ab64929525bfeac2a9045cf91df7017239b301fee472e4b47a69b6d6daf",
                    marker=",",
                    note="PFedRec CSV copy, rows ordered by user",
                ),
            ),
            sources=(
                Source(
                    "GroupLens",
                    "https://files.grouplens.org/datasets/movielens/ml-100k.zip",
                    checksum="sha256:50d2a982c66986937beb9ffb3aa76efe955bf3d5c6b761f4e3a7cd717c6a3229",
                    # GroupLens publishes md5 0e33842e24a9c977be4e0107933c0723 (ml-100k.zip.md5).
                    checksum_source="tensorflow/datasets url_checksums/movielens.txt",
                    members=("ml-100k/u.data",),
                ),
                Source(
                    "PyPI recbole==1.2.1 wheel",
                    "recbole==1.2.1",
                    kind="pip-wheel",
                    # sha256 of recbole-1.2.1-py3-none-any.whl as served by PyPI (pip also checks
                    # it against the index's own hash while downloading).
                    checksum="sha256:9c9948202011f37eb0a7c6768129313f00d6403ad221ec940d5e2d5d5f33a407",
                    checksum_source="computed from the PyPI wheel with pip download",
                    members=("recbole/dataset_example/ml-100k/ml-100k.inter",),
                ),
            ),
            folders=("ml-100k",),
        ),
        DatasetSpec(
            name="ml-1m",
            description="MovieLens 1M: 1,000,209 ratings (1-5) by 6,040 users on 3,706 movies",
            citation=_MOVIELENS,
            homepage="https://grouplens.org/datasets/movielens/1m/",
            files=(
                RawFile("ratings.dat", parsers.parse_ml1m, marker="::", note="GroupLens original"),
            ),
            sources=(
                Source(
                    "GroupLens",
                    "https://files.grouplens.org/datasets/movielens/ml-1m.zip",
                    checksum="sha256:a6898adb50b9ca05aa231689da44c217cb524e7ebd39d264c56e2832f2c54e20",
                    # GroupLens publishes md5 c4d9eecfca2ab87c1945afe126590906 (ml-1m.zip.md5).
                    checksum_source="tensorflow/datasets url_checksums/movielens.txt",
                    members=("ml-1m/ratings.dat",),
                ),
            ),
            folders=("ml-1m",),
        ),
        DatasetSpec(
            name="lastfm-2k",
            description=(
                "HetRec 2011 Last.fm tag assignments as PFedRec, FedRAP and GFed-PP use them: "
                "users with >= 5 assignments; 1,600 users, 12,454 artists, 185,650 assignments "
                "(70,508 distinct user-artist pairs)"
            ),
            citation=_HETREC,
            homepage="https://grouplens.org/datasets/hetrec-2011/",
            files=(
                RawFile(
                    "user_taggedartists-timestamps.dat",
                    parsers.parse_lastfm_tagged,
                    note="one implicit row per tag assignment, clock in milliseconds (PFedRec's copy)",
                ),
                RawFile(
                    "user_taggedartists.dat",
                    parsers.parse_lastfm_tagged_dates,
                    note="the same assignments with day/month/year",
                ),
            ),
            sources=(_hetrec_lastfm("user_taggedartists-timestamps.dat", "user_taggedartists.dat"),),
            folders=_LASTFM_FOLDERS,
            implicit=True,
            min_user_rows=5,
            count_rows=True,
        ),
        DatasetSpec(
            name="lastfm-2k-listens",
            description="HetRec 2011 Last.fm listening counts: 92,834 by 1,892 users on 17,632 artists",
            citation=_HETREC,
            homepage="https://grouplens.org/datasets/hetrec-2011/",
            files=(RawFile("user_artists.dat", parsers.parse_lastfm_user_artists, note="weight as rating"),),
            sources=(_hetrec_lastfm("user_artists.dat"),),
            folders=_LASTFM_FOLDERS,
            clock=False,
        ),
        DatasetSpec(
            name="ml-1m-fedcia",
            description=(
                "FedCIA's published ML-1M split: 6,040 users in 100 clients (contiguous blocks), "
                "3,706 movies, implicit; train/valid/test 720,150 / 80,017 / 200,042 "
                "(protocol given-full)"
            ),
            citation=_MOVIELENS,
            homepage="https://github.com/Mingzhe-Han/FedCIA",
            files=(
                RawFile(
                    "fedcia_ml1m_100_split.tsv",
                    parsers.parse_fedcia_split,
                    sha256="71c35e3f2bfdf257fc06d2ece87bc147c74e50964f60fe92677a1fa415269e02",
                    note="client, user_in_client, user_global, item, split (one row per event)",
                ),
            ),
            manual_download=(
                "re-encode the 300 files datasets/ml1m_100/<client>/{train,valid,test}_dataset.npy "
                "of https://github.com/Mingzhe-Han/FedCIA as a TSV with header "
                "'client user_in_client user_global item split' (one row per 1 in the matrices; "
                "user_global = 60 x client + user_in_client, item = the column)"
            ),
            folders=("ml-1m-fedcia", "ml1m_100"),
            implicit=True,
            clock=False,
        ),
        DatasetSpec(
            name="ciao",
            description=(
                "Ciao ratings (1-5) as MetaMF splits them: 7,375 users, 105,096 items; "
                "train/valid/test 223,006 / 28,240 / 31,373 (protocol given-rating)"
            ),
            citation=(
                "Jiliang Tang, Huiji Gao and Huan Liu. 2012. mTrust: Discerning multi-faceted trust "
                "in a connected world. WSDM 2012. Split: Yujie Lin et al. 2020. Meta Matrix "
                "Factorization for Federated Rating Predictions. SIGIR 2020."
            ),
            homepage="https://github.com/TempSDU/MetaMF",
            files=(
                RawFile(
                    "ciao.train.rating",
                    parsers.parse_metamf_split,
                    sha256="ca7b498cad3ea85503369f7e0c20eba3457993f7f0836cbf2007455b7f066550",
                    note="with ciao.valid.rating and ciao.test.rating beside it",
                ),
            ),
            manual_download=(
                "download data/ciao.{train,valid,test}.rating from "
                "https://github.com/TempSDU/MetaMF (commit bbfdf0b) into one folder"
            ),
            folders=("ciao",),
            clock=False,
        ),
        DatasetSpec(
            name="hetrec-movielens",
            description=(
                "HetRec 2011 MovieLens: 855,598 ratings (0.5-5) by 2,113 users on 10,197 movies"
            ),
            citation=_HETREC,
            homepage="https://grouplens.org/datasets/hetrec-2011/",
            files=(RawFile("user_ratedmovies-timestamps.dat", parsers.parse_hetrec_movielens),),
            sources=(
                Source(
                    "GroupLens",
                    "https://files.grouplens.org/datasets/hetrec2011/hetrec2011-movielens-2k-v2.zip",
                    checksum=None,
                    checksum_source="no published checksum found",
                    members=("user_ratedmovies-timestamps.dat",),
                ),
            ),
            folders=("hetrec-movielens", "hetrec2011-movielens-2k-v2", "hetrec2011-movielens-2k"),
        ),
        DatasetSpec(
            name="amazon-video",
            description="Amazon Instant Video ratings (2014 ratings-only CSV, string ids)",
            citation=(
                "Ruining He and Julian McAuley. 2016. Ups and Downs: Modeling the Visual Evolution "
                "of Fashion Trends with One-Class Collaborative Filtering. WWW 2016."
            ),
            homepage="https://cseweb.ucsd.edu/~jmcauley/datasets/amazon/links.html",
            files=(RawFile("ratings_Amazon_Instant_Video.csv", parsers.parse_amazon_ratings),),
            sources=(
                Source(
                    "SNAP (McAuley 2014)",
                    "http://snap.stanford.edu/data/amazon/productGraph/categoryFiles/"
                    "ratings_Amazon_Instant_Video.csv",
                    kind="file",
                    checksum=None,
                    checksum_source="no published checksum found",
                ),
            ),
            folders=("amazon-video", "amazon"),
        ),
        DatasetSpec(
            name="tafeng",
            description="Ta Feng grocery purchases, Nov 2000 - Feb 2001 (implicit)",
            citation=(
                "Chun-Nan Hsu, Hao-Hsiang Chung and Han-Shen Huang. 2004. Mining Skewed and "
                "Sparse Transaction Data for Personalized Shopping Recommendation. Machine "
                "Learning 57."
            ),
            homepage="https://www.kaggle.com/datasets/chiranjivdas09/ta-feng-grocery-dataset",
            files=(RawFile("ta_feng_all_months_merged.csv", parsers.parse_tafeng),),
            manual_download=(
                "download ta_feng_all_months_merged.csv from "
                "https://www.kaggle.com/datasets/chiranjivdas09/ta-feng-grocery-dataset "
                "(needs a Kaggle login)"
            ),
            folders=("tafeng", "ta-feng"),
            implicit=True,
        ),
        DatasetSpec(
            name="anime",
            description=(
                "Kaggle Anime Recommendations: 7.8M ratings (1-10; -1 = watched but unrated, "
                "dropped by default) by 73,515 users on 11,200 anime"
            ),
            citation="CooperUnion. 2016. Anime Recommendations Database. Kaggle.",
            homepage="https://www.kaggle.com/datasets/CooperUnion/anime-recommendations-database",
            files=(RawFile("rating.csv", parsers.parse_anime),),
            manual_download=(
                "download rating.csv from "
                "https://www.kaggle.com/datasets/CooperUnion/anime-recommendations-database "
                "(needs a Kaggle login)"
            ),
            folders=("anime", "anime-recommendations-database"),
            clock=False,
        ),
        DatasetSpec(
            name="book-crossing",
            description=(
                "Book-Crossing: 1,149,780 book ratings (1-10 explicit, 0 implicit) by 105,283 users"
            ),
            citation=(
                "Cai-Nicolas Ziegler, Sean M. McNee, Joseph A. Konstan and Georg Lausen. 2005. "
                "Improving Recommendation Lists Through Topic Diversification. WWW 2005."
            ),
            homepage="http://www2.informatik.uni-freiburg.de/~cziegler/BX/",
            files=(RawFile("BX-Book-Ratings.csv", parsers.parse_book_crossing),),
            sources=(
                Source(
                    "Uni Freiburg (original host, often offline)",
                    "http://www2.informatik.uni-freiburg.de/~cziegler/BX/BX-CSV-Dump.zip",
                    # The publisher gives no hash; md5 (and size 26,085,508) as pinned in
                    # PIReTship/bookdata-tools bx/dvc.lock.
                    checksum="md5:37d647ee9e18ba134ea6d78ee4fe5292",
                    checksum_source="PIReTship/bookdata-tools bx/dvc.lock",
                    members=("BX-Book-Ratings.csv",),
                ),
            ),
            folders=("book-crossing", "BX-CSV-Dump", "bx"),
            clock=False,
        ),
    )
}
